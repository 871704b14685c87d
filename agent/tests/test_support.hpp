// Shared helpers of the agent tests: shell workers, running an io_context until a condition
// (with a deadline), capturing the console through a pipe, temporary directories, /proc scans.
#pragma once

#include "log_file_writer.hpp"
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "drun/agent/console_writer.hpp"
#include "drun/agent/job_guard.hpp"
#include "drun/agent/worker_group.hpp"

namespace drun::agent::test {

using namespace std::chrono_literals;

inline WorkerSpec shellWorker(int localRank, const std::string& script, int globalRank = -1) {
  WorkerSpec spec;
  spec.localRank = localRank;
  spec.globalRank = globalRank < 0 ? localRank : globalRank;
  spec.argv = {"/bin/sh", "-c", script};
  spec.env = {"PATH=/usr/local/bin:/usr/bin:/bin", "LC_ALL=C"};
  return spec;
}

// Runs `io` until `done()` or the deadline; true when done() became true.
inline bool runUntil(boost::asio::io_context& io, const std::function<bool()>& done,
                     std::chrono::milliseconds timeout = 10s) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    io.restart();
    io.run_one_for(std::min<std::chrono::steady_clock::duration>(deadline - now, 50ms));
  }
  return true;
}

// Waits for a condition outside this process (other processes' state), looking every
// millisecond, within a bound; true when it held.
inline bool eventually(const std::function<bool()>& condition,
                       std::chrono::milliseconds timeout = 5s) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (condition()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
}

// Directory next to the test binary, where the helper programs are built.
inline std::filesystem::path helperDir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path();
}

// A pipe standing in for drun's stdout or stderr, drained by its own thread. Lines are posted to
// `io`. When a ConsoleWriter feeds it (feedBy()), the writer is drained before the pipe closes.
class ConsoleCapture {
 public:
  explicit ConsoleCapture(boost::asio::io_context& io, bool nonBlockingWriteEnd = false) : io_(io) {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
    readFd_ = fds[0];
    writeFd_ = fds[1];
    if (nonBlockingWriteEnd) ::fcntl(writeFd_, F_SETFL, ::fcntl(writeFd_, F_GETFL) | O_NONBLOCK);
    reader_ = std::thread([this] { drain(); });
  }
  ~ConsoleCapture() {
    closeWriteEnd();
    if (reader_.joinable()) reader_.join();
    ::close(readFd_);
  }
  int fd() const { return writeFd_; }
  // Called on the io thread for every complete line, those captured before the call included.
  void onLine(std::function<void(const std::string&)> handler) {
    std::lock_guard lock(mutex_);
    onLine_ = std::move(handler);
    for (const auto& line : lines_) boost::asio::post(io_, [h = onLine_, line] { h(line); });
  }
  void feedBy(const std::shared_ptr<ConsoleWriter>& writer) { writer_ = writer; }
  void closeWriteEnd() {
    if (auto writer = writer_.lock()) writer->drain(10s);  // what it queued, before the fd goes
    if (writeFd_ >= 0) ::close(std::exchange(writeFd_, -1));
  }
  // Everything captured so far (call closeWriteEnd() first to be sure all of it arrived).
  std::string text() {
    std::lock_guard lock(mutex_);
    return text_;
  }
  std::string waitAll() {
    closeWriteEnd();
    if (reader_.joinable()) reader_.join();
    return text();
  }

 private:
  void drain() {
    std::vector<char> buf(256 * 1024);
    std::string line;
    for (;;) {
      ssize_t n = ::read(readFd_, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      std::lock_guard lock(mutex_);
      text_.append(buf.data(), static_cast<size_t>(n));
      for (ssize_t i = 0; i < n; ++i) {
        if (buf[i] != '\n') {
          if (line.size() < 4096) line += buf[i];
          continue;
        }
        if (onLine_) boost::asio::post(io_, [handler = onLine_, l = line] { handler(l); });
        if (lines_.size() < 10000) lines_.push_back(line);
        line.clear();
      }
    }
  }

  boost::asio::io_context& io_;
  int readFd_ = -1;
  int writeFd_ = -1;
  std::mutex mutex_;
  std::string text_;
  std::vector<std::string> lines_;  // the first complete lines (capped), replayed to onLine()
  std::function<void(const std::string&)> onLine_;
  std::weak_ptr<ConsoleWriter> writer_;
  std::thread reader_;
};

// GroupOptions whose console is a ConsoleWriter of its own over these fds (they must outlive it).
inline GroupOptions consoleOptions(int stdoutFd, int stderrFd) {
  GroupOptions options;
  options.output.console = std::make_shared<ConsoleWriter>(ConsoleWriterOptions{stdoutFd, stderrFd});
  return options;
}

// The same over two captures, which drain the writer before they close.
inline GroupOptions consoleOptions(ConsoleCapture& out, ConsoleCapture& err) {
  GroupOptions options = consoleOptions(out.fd(), err.fd());
  out.feedBy(options.output.console);
  err.feedBy(options.output.console);
  return options;
}

// A test's io_context and captured console, and GroupOptions writing to it (TEST_CASE_METHOD).
struct CapturedConsole {
  boost::asio::io_context io;
  ConsoleCapture out{io};
  ConsoleCapture err{io};
  GroupOptions options = consoleOptions(out, err);
};

inline std::vector<std::string> splitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

inline std::string readFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// A worker's log file once the process-wide log writer has written everything queued so far:
// a worker is reported when its pipes reach EOF, while its bytes may still wait in the writer's
// queue (log_file_writer.hpp).
inline std::string readLogFile(const std::filesystem::path& path) {
  if (!detail::LogFileWriter::standard()->drain(std::chrono::seconds(10)))
    throw std::runtime_error("the log writer did not drain within 10 s");
  return readFile(path);
}

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("drun-agent-test-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Live processes (not zombies) whose environment holds the entry `marker`.
inline std::vector<pid_t> processesWithEnvEntry(const std::string& marker) {
  std::vector<pid_t> found;
  std::string needle = std::string(1, '\0') + marker + std::string(1, '\0');
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string environ = std::string(1, '\0') + readFile(entry.path() / "environ");
    if (environ.back() != '\0') environ += '\0';
    if (environ.find(needle) != std::string::npos) found.push_back(std::stoi(name));
  }
  return found;
}

// A forked child playing drun: a WorkerGroup running `worker`, its console the report pipe the
// test reads; with `withGuard` also a JobGuard, whose token it reports first ("token <hex>").
class StandInDrun {
 public:
  StandInDrun(const WorkerSpec& worker, bool withGuard) {
    int report[2];
    REQUIRE(::pipe2(report, O_CLOEXEC) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      try {
        ::close(report[0]);
        std::optional<JobGuard> guard;
        if (withGuard) {
          guard.emplace(JobGuard::start());
          std::string line = "token " + guard->token() + "\n";
          if (::write(report[1], line.data(), line.size()) < 0) ::_exit(1);
        }
        boost::asio::io_context io;
        GroupOptions options = consoleOptions(report[1], 2);
        options.jobGuard = guard ? &*guard : nullptr;
        WorkerGroup group(io, options);
        group.start({worker});
        io.run();
      } catch (...) {
      }
      ::_exit(1);  // never back into the test runner
    }
    ::close(report[1]);
    reportFd_ = report[0];
  }
  ~StandInDrun() {
    kill();
    ::close(reportFd_);
  }
  // Reads report lines until one starts with `last` (or EOF, or 10 s); returns all of them.
  std::vector<std::string> readLinesUntil(const std::string& last) {
    std::vector<std::string> lines;
    std::string current;
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{reportFd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char c;
      if (::read(reportFd_, &c, 1) != 1) break;
      if (c != '\n') {
        current += c;
        continue;
      }
      lines.push_back(current);
      if (current.rfind(last, 0) == 0) break;
      current.clear();
    }
    return lines;
  }
  // SIGKILL, as drun may die, and reap.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int reportFd_ = -1;
};

}  // namespace drun::agent::test

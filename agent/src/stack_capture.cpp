#include "stack_capture.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "child_reaper.hpp"
#include "handler_guard.hpp"
#include "process_spawn.hpp"

extern char** environ;

namespace drun::agent::detail {
namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxToolOutput = 256 * 1024;
constexpr size_t kMaxLineBytes = 200;

std::vector<std::string> environment() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) out.emplace_back(*e);
  return out;
}

std::string readSmallFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// A stack tool's output is a stack when it shows frames ("#0 ", "#1 " in both tools).
bool looksLikeStack(const std::string& text) { return text.find("#0 ") != std::string::npos || text.find("#1 ") != std::string::npos; }

class Capture : public StackCapture, public std::enable_shared_from_this<Capture> {
 public:
  Capture(asio::io_context& io, pid_t pid, std::chrono::milliseconds deadline, Done done)
      : io_(io), pid_(pid), deadline_(Clock::now() + deadline), done_(std::move(done)), timer_(io), pipe_(io) {}

  void begin() {
    const std::string p = std::to_string(pid_);
    tools_ = {{"eu-stack", {"eu-stack", "-p", p}},
              {"gdb", {"gdb", "-p", p, "-batch", "-nx", "-q", "-ex", "thread apply all bt"}}};
    next();
  }

  void cancel() override {
    cancelled_ = true;
    killTool();
    timer_.cancel();
    boost::system::error_code ignored;
    pipe_.close(ignored);
  }

 private:
  struct Tool {
    std::string name;
    std::vector<std::string> argv;
  };

  void next() {
    while (!cancelled_ && tool_ < tools_.size() && Clock::now() < deadline_) {
      if (launch(tools_[tool_++])) return;
    }
    finish({"/proc wchan", procThreadStates(pid_)});
  }

  bool launch(const Tool& tool) {
    int error = 0;
    std::vector<std::string> env = environment();
    std::string path = resolveProgram(tool.argv[0], env, &error);
    if (path.empty() || error) return false;
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return false;
    SpawnRequest request;
    request.path = path;
    request.argv = tool.argv;
    request.env = std::move(env);
    const int devNull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    request.stdinFd = devNull;
    request.stdoutFd = fds[1];
    request.stderrFd = fds[1];
    SpawnResult result;
    ChildReaper::instance().spawnWatched(
        [&] {
          result = spawnProcess(request);
          return result.pid;
        },
        nullptr);
    ::close(fds[1]);
    if (devNull >= 0) ::close(devNull);
    if (result.pid < 0 || result.error != 0) {
      ::close(fds[0]);
      return false;
    }
    toolPid_ = result.pid;
    toolName_ = tool.name;
    output_.clear();
    pipe_.assign(fds[0]);
    timer_.expires_at(deadline_);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) guarded("a stack capture's deadline", [&] { self->killTool(); });
    });
    read();
    return true;
  }

  void read() {
    pipe_.async_read_some(asio::buffer(buffer_), [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
      guarded("a stack capture's output", [&] { self->onRead(ec, n); });
    });
  }

  void onRead(const boost::system::error_code& ec, size_t n) {
    if (cancelled_) return;
    if (!ec) {
      if (output_.size() < kMaxToolOutput) output_.append(buffer_.data(), std::min(n, kMaxToolOutput - output_.size()));
      read();
      return;
    }
    // EOF (the tool exited) or the pipe was closed.
    timer_.cancel();
    boost::system::error_code ignored;
    pipe_.close(ignored);
    killTool();
    if (looksLikeStack(output_)) {
      finish({toolName_, output_});
      return;
    }
    next();
  }

  void killTool() {
    if (toolPid_ > 0) ::kill(toolPid_, SIGKILL);  // the reaper collects it
    toolPid_ = -1;
  }

  void finish(StackExcerpt stack) {
    if (cancelled_ || !done_) return;
    stack.raw = stack.text;
    stack.text = excerpt(stack.raw, kMaxStackLines);
    Done done = std::move(done_);
    done_ = nullptr;
    done(std::move(stack));
  }

  asio::io_context& io_;
  pid_t pid_;
  Clock::time_point deadline_;
  Done done_;
  asio::steady_timer timer_;
  asio::posix::stream_descriptor pipe_;
  std::array<char, 4096> buffer_{};
  std::vector<Tool> tools_;
  size_t tool_ = 0;
  pid_t toolPid_ = -1;
  std::string toolName_;
  std::string output_;
  bool cancelled_ = false;
};

}  // namespace

std::shared_ptr<StackCapture> StackCapture::start(asio::io_context& io, pid_t pid,
                                                  std::chrono::milliseconds deadline, Done done) {
  auto capture = std::make_shared<Capture>(io, pid, deadline, std::move(done));
  // Started from the loop on the next turn: `done` never runs inside start().
  asio::post(io, [capture] { guarded("a stack capture", [&] { capture->begin(); }); });
  return capture;
}

std::string procThreadStates(pid_t pid) noexcept {
  try {
    namespace fs = std::filesystem;
    std::ostringstream out;
    std::error_code ec;
    const fs::path task = "/proc/" + std::to_string(pid) + "/task";
    for (const auto& entry : fs::directory_iterator(task, ec)) {
      const std::string tid = entry.path().filename().string();
      std::string stat = readSmallFile(entry.path() / "stat");
      std::string state = "?";
      if (auto close = stat.rfind(')'); close != std::string::npos && close + 2 < stat.size())
        state = stat.substr(close + 2, 1);
      std::string wchan = readSmallFile(entry.path() / "wchan");
      out << "thread " << tid << " (" << readSmallFile(entry.path() / "comm") << "): state " << state
          << ", " << (wchan.empty() || wchan == "0" ? "running" : "waiting in " + wchan) << "\n";
    }
    std::string text = out.str();
    return text.empty() ? "(no /proc/" + std::to_string(pid) + "/task: the process is gone)\n" : text;
  } catch (...) {
    return "(could not read /proc)\n";
  }
}

std::string excerpt(const std::string& text, size_t maxLines) {
  std::istringstream in(text);
  std::string line, out;
  size_t lines = 0, left = 0;
  while (std::getline(in, line)) {
    if (lines == maxLines) {
      ++left;
      continue;
    }
    std::string clean;
    for (unsigned char c : line.substr(0, kMaxLineBytes)) clean += (c >= 0x20 && c < 0x7f) || c == '\t' ? static_cast<char>(c) : '?';
    if (line.size() > kMaxLineBytes) clean += "...";
    out += clean + "\n";
    ++lines;
  }
  if (left) out += "... (" + std::to_string(left) + " more lines)\n";
  return out;
}

}  // namespace drun::agent::detail

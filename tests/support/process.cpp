// Subprocess harness for the end-to-end tests (see process.hpp).
#include "process.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <utility>

extern char** environ;

namespace drun::test {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

[[noreturn]] void throwErrno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

bool startsWith(const std::string& s, std::string_view prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

std::string keyOf(const std::string& entry) { return entry.substr(0, entry.find('=')); }

// The test runner's environment minus anything that would change drun's behaviour, then the
// test's own changes.
std::vector<std::string> childEnvironment(const std::vector<std::string>& changes) {
  static const std::vector<std::string_view> kDropPrefixes = {
      "PET_", "TORCHELASTIC_", "DRUN_", "PYTHON_EXEC=", "E2E_MARKER=", "SLURM_"};
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string entry(*e);
    bool drop = false;
    for (auto prefix : kDropPrefixes) drop = drop || startsWith(entry, prefix);
    if (!drop) env.push_back(std::move(entry));
  }
  for (const auto& change : changes) {
    std::string key = keyOf(change);
    std::erase_if(env, [&](const std::string& entry) { return keyOf(entry) == key; });
    if (change.find('=') != std::string::npos) env.push_back(change);
  }
  return env;
}

// A pseudo-terminal pair standing in for the user's terminal: bytes pass as written (no OPOST, so
// no "\r\n"), nothing is echoed, 40 rows x 120 columns. Both ends O_CLOEXEC.
std::pair<int, int> openTerminal() {
  int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) throwErrno("posix_openpt");
  char name[128];
  if (::grantpt(master) != 0 || ::unlockpt(master) != 0 || ::ptsname_r(master, name, sizeof name) != 0)
    throwErrno("grantpt/unlockpt/ptsname_r");
  int slave = ::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (slave < 0) throwErrno(std::string("open ") + name);
  termios tio;
  if (::tcgetattr(slave, &tio) != 0) throwErrno("tcgetattr");
  tio.c_oflag &= ~static_cast<tcflag_t>(OPOST);
  tio.c_lflag &= ~static_cast<tcflag_t>(ECHO | ECHONL);
  if (::tcsetattr(slave, TCSANOW, &tio) != 0) throwErrno("tcsetattr");
  winsize size{};
  size.ws_row = 40;
  size.ws_col = 120;
  ::ioctl(slave, TIOCSWINSZ, &size);
  return {master, slave};
}

std::string cutMiddle(const std::string& s, size_t keep = 3000) {
  if (s.size() <= 2 * keep) return s;
  return s.substr(0, keep) + "\n... [" + std::to_string(s.size() - 2 * keep) + " bytes cut] ...\n" +
         s.substr(s.size() - keep);
}

}  // namespace

int pidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// ---- RunResult ---------------------------------------------------------------------------------

std::string RunResult::describe() const {
  std::ostringstream ss;
  ss << "status " << status() << (signal ? " (killed by signal " + std::to_string(signal) + ")" : "")
     << (timedOut ? " TIMED OUT" : "") << ", wall " << wall.count() << " ms\n"
     << "---- stdout (" << out.size() << " bytes) ----\n"
     << cutMiddle(out) << "\n---- stderr (" << err.size() << " bytes) ----\n"
     << cutMiddle(err) << "\n----";
  return ss.str();
}

// ---- Process -----------------------------------------------------------------------------------

Process::Process(RunOptions options) : options_(std::move(options)) {
  if (options_.argv.empty()) throw std::invalid_argument("Process: empty argv");

  // Everything the child needs is prepared before fork: after fork only async-signal-safe calls.
  std::vector<std::string> env = childEnvironment(options_.env);
  std::vector<char*> argvPtrs, envPtrs;
  for (auto& a : options_.argv) argvPtrs.push_back(a.data());
  argvPtrs.push_back(nullptr);
  for (auto& e : env) envPtrs.push_back(e.data());
  envPtrs.push_back(nullptr);
  std::string cwd = options_.cwd.string();

  int outPipe[2], errPipe[2], inPipe[2] = {-1, -1};
  if (options_.stdoutTerminal) {
    auto [master, slave] = openTerminal();
    outPipe[0] = master;
    outPipe[1] = slave;
  } else if (::pipe2(outPipe, O_CLOEXEC) != 0) {
    throwErrno("pipe2");
  }
  if (::pipe2(errPipe, O_CLOEXEC) != 0) throwErrno("pipe2");
  if (options_.stdinPipe && ::pipe2(inPipe, O_CLOEXEC) != 0) throwErrno("pipe2");
  if (::pipe2(wakeFd_, O_CLOEXEC) != 0) throwErrno("pipe2");
  const bool terminal = options_.stdoutTerminal;
  const int errTarget = terminal && options_.stderrTerminal ? outPipe[1] : errPipe[1];
  const int inTarget = terminal && options_.stdinTerminal ? outPipe[1] : inPipe[0];
  pid_t parent = ::getpid();

  started_ = Clock::now();
  pid_ = ::fork();
  if (pid_ < 0) throwErrno("fork");
  if (pid_ == 0) {
    // Own process group, so signals we send reach only this child; die with the test binary. With
    // a terminal: a session of its own, whose controlling terminal it is (as a login shell's).
    if (terminal) {
      ::setsid();
      ::ioctl(outPipe[1], TIOCSCTTY, 0);
    } else {
      ::setpgid(0, 0);
    }
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    // Signal dispositions and the mask are inherited through exec: start from a clean state.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; ++s) ::sigaction(s, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (inTarget >= 0) ::dup2(inTarget, 0);
    else if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(outPipe[1], 1);
    ::dup2(errTarget, 2);
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) {
      const char msg[] = "e2e harness: chdir failed\n";
      (void)!::write(2, msg, sizeof msg - 1);
      ::_exit(127);
    }
    ::execve(argvPtrs[0], argvPtrs.data(), envPtrs.data());
    const char msg[] = "e2e harness: execve failed: ";
    (void)!::write(2, msg, sizeof msg - 1);
    const char* reason = ::strerror(errno);
    (void)!::write(2, reason, ::strlen(reason));
    (void)!::write(2, "\n", 1);
    ::_exit(127);
  }
  ::close(outPipe[1]);
  ::close(errPipe[1]);
  if (inPipe[0] >= 0) ::close(inPipe[0]);
  inFd_ = inPipe[1];
  if (terminal && options_.stdinTerminal) inFd_ = ::fcntl(outPipe[0], F_DUPFD_CLOEXEC, 3);
  outFd_ = outPipe[0];
  errFd_ = errPipe[0];
  pidfd_ = pidfdOpen(pid_);
  if (pidfd_ < 0) throwErrno("pidfd_open");
  reader_ = std::thread([this] { readLoop(); });
}

Process::~Process() {
  if (!result_) {
    ::kill(pid_, SIGKILL);
    try {
      wait(5s);
    } catch (...) {
    }
  }
  if (reader_.joinable()) {
    (void)!::write(wakeFd_[1], "x", 1);
    reader_.join();
  }
  for (int fd : {pidfd_, outFd_, errFd_, inFd_, wakeFd_[0], wakeFd_[1]})
    if (fd >= 0) ::close(fd);
}

void Process::readLoop() {
  char buf[65536];
  bool outOpen = true, errOpen = true;
  size_t outLines = 0;
  while (outOpen || errOpen) {
    pollfd fds[3] = {{outOpen ? outFd_ : -1, POLLIN, 0},
                     {errOpen ? errFd_ : -1, POLLIN, 0},
                     {wakeFd_[0], POLLIN, 0}};
    if (::poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[2].revents) break;  // abandoned: a leaked descendant holds the pipe
    for (int i = 0; i < 2; ++i) {
      if (!fds[i].revents) continue;
      ssize_t n = ::read(i == 0 ? outFd_ : errFd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      std::lock_guard lock(mutex_);
      if (n <= 0) {
        (i == 0 ? outOpen : errOpen) = false;  // a terminal's EIO (no writer left) is its EOF
      } else {
        (i == 0 ? out_ : err_).append(buf, static_cast<size_t>(n));
        if (i == 0) outLines += static_cast<size_t>(std::count(buf, buf + n, '\n'));
      }
      if (i == 0 && outOpen && options_.closeStdoutAfterLines &&
          outLines >= *options_.closeStdoutAfterLines) {
        ::close(std::exchange(outFd_, -1));  // `| head -N`: the reader goes away
        outOpen = false;
      }
      changed_.notify_all();
    }
  }
  std::lock_guard lock(mutex_);
  pipesClosed_ = true;
  changed_.notify_all();
}

void Process::writeStdin(const std::string& text) {
  if (inFd_ < 0) throw std::logic_error("Process::writeStdin: no stdin pipe or terminal");
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(inFd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throwErrno("writing the child's stdin");
    done += static_cast<size_t>(n);
  }
}

void Process::closeStdin() {
  if (options_.stdinTerminal) return writeStdin("\x04");  // VEOF at the start of a line
  if (inFd_ >= 0) ::close(std::exchange(inFd_, -1));
}

void Process::resizeTerminal(unsigned short rows, unsigned short cols) {
  if (!options_.stdoutTerminal) throw std::logic_error("Process::resizeTerminal: no terminal");
  winsize size{};
  size.ws_row = rows;
  size.ws_col = cols;
  std::lock_guard lock(mutex_);  // outFd_ may be closed by the reader once the child is gone
  if (outFd_ >= 0 && ::ioctl(outFd_, TIOCSWINSZ, &size) != 0) throwErrno("TIOCSWINSZ");
}

void Process::signal(int sig) const {
  if (!result_) ::kill(pid_, sig);
}

bool Process::waitForOutput(
    const std::function<bool(const std::string&, const std::string&)>& pred,
    std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + scaled(timeout);
  std::unique_lock lock(mutex_);
  while (true) {
    if (pred(out_, err_)) return true;
    if (pipesClosed_) return false;
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) return pred(out_, err_);
  }
}

bool Process::waitForLines(const std::string& needle, size_t count,
                           std::chrono::milliseconds timeout) {
  return waitForOutput(
      [&](const std::string& out, const std::string&) {
        size_t found = 0;
        for (size_t pos = out.find(needle); pos != std::string::npos;
             pos = out.find(needle, pos + needle.size()))
          if (++found >= count) return true;
        return false;
      },
      timeout);
}

RunResult Process::wait(std::optional<std::chrono::milliseconds> timeout) {
  if (result_) return *result_;
  auto deadline =
      timeout ? Clock::now() + scaled(*timeout) : started_ + scaled(options_.timeout);
  RunResult result;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd pfd{pidfd_, POLLIN, 0};
    int rc = ::poll(&pfd, 1, static_cast<int>(std::max<long long>(0, left.count())));
    if (rc < 0 && errno == EINTR) continue;
    if (rc > 0) break;
    // Deadline: kill by PID (its process group is its own, but only the PID is ours to kill;
    // anything it leaves is swept by the test's MarkerScope).
    result.timedOut = true;
    ::kill(pid_, SIGKILL);
    break;
  }
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  auto exitedAt = Clock::now();
  if (WIFEXITED(status)) result.exitCode = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.signal = WTERMSIG(status);
  {
    std::unique_lock lock(mutex_);
    if (!changed_.wait_for(lock, 2s, [&] { return pipesClosed_; })) {
      lock.unlock();
      (void)!::write(wakeFd_[1], "x", 1);  // a leaked process holds our pipe: stop reading
      lock.lock();
    }
  }
  reader_.join();
  {
    std::lock_guard lock(mutex_);
    result.out = out_;
    result.err = err_;
  }
  result.wall = std::chrono::duration_cast<std::chrono::milliseconds>(exitedAt - started_);
  result_ = result;
  return result;
}

RunResult run(RunOptions options) {
  Process p(std::move(options));
  return p.wait();
}

}  // namespace drun::test

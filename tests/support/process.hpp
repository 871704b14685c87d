// Subprocess harness for the end-to-end tests: run drun (or any program) as a user would, with a
// deadline, and look at what it printed, how it exited and what it left behind.
//
// - run(): start, capture stdout and stderr separately, wait with a deadline. On timeout the child
//   is SIGKILLed by PID and the result says timedOut (tests REQUIRE(!timedOut)).
// - Process: the same in the background: wait until its output shows something (a "READY" line),
//   send it a signal, wait for its exit.
// - Leftover detection: every test passes a unique marker variable (E2E_MARKER=<random>) to drun,
//   which passes its environment on to the workers, so any process of the job, even one that called
//   setsid, can be found by scanning /proc/<pid>/environ. MarkerScope SIGKILLs (by PID) whatever
//   still carries its marker when the test ends, so a broken drun cannot leak processes into the
//   rest of the suite.
// - Paths: drun at $DRUN_BUILD_DIR/bin/drun, helpers at $DRUN_BUILD_DIR/tests/helpers/<name>.
//
// Threading: a Process reads its pipes on one background thread; all public calls are made from the
// test's thread. Ownership: a Process owns its child; destroying a running one SIGKILLs and reaps
// it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "time_scale.hpp"

namespace drun::test {

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A file's bytes ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// True in a build with a sanitizer (scripts/sanitize.sh): ASan keeps freed memory in quarantine
// and both shadow every allocation, so a process's RSS says nothing about growth there (LeakSanitizer
// checks leaks instead); tests skip their memory bounds.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif


using namespace std::chrono_literals;

struct RunOptions {
  std::vector<std::string> argv;  // argv[0] is a path (no PATH lookup)
  // Changes to the inherited environment: "KEY=VALUE" sets, "KEY" (no '=') removes. PET_*,
  // TORCHELASTIC_* and DRUN_* settings of the test runner are always removed first so that they
  // cannot change drun's behaviour behind a test's back.
  std::vector<std::string> env;
  std::filesystem::path cwd;  // empty = the test's cwd
  std::chrono::milliseconds timeout = 30s;
  // The user's terminal: stdout on a pseudo-terminal the harness opens (the child's controlling
  // terminal, its session's foreground, as in an interactive shell; window size 40x120; no output
  // post-processing and no echo, so `out` holds exactly the bytes written). stderr and stdin can
  // share it; what stdin reads is typed with Process::writeStdin (a line at a time: canonical mode).
  bool stdoutTerminal = false;
  bool stderrTerminal = false;  // stderr on the same terminal (needs stdoutTerminal)
  bool stdinTerminal = false;   // stdin from the same terminal (needs stdoutTerminal)
  // stdin from a pipe the test writes with Process::writeStdin (default: /dev/null).
  bool stdinPipe = false;
  // `| head -N`: the harness reads N lines of stdout, then closes its read end.
  std::optional<size_t> closeStdoutAfterLines = std::nullopt;
};

struct RunResult {
  std::string out;
  std::string err;
  int exitCode = -1;  // valid when signal == 0
  int signal = 0;     // the signal that killed it, 0 when it exited
  bool timedOut = false;
  std::chrono::milliseconds wall{0};
  // Shell convention: exitCode, or 128 + signal.
  int status() const { return signal ? 128 + signal : exitCode; }
  // For failure messages: status, wall time and both streams (long streams cut in the middle).
  std::string describe() const;
};

class Process {
 public:
  explicit Process(RunOptions options);  // starts it
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig) const;  // kill(pid, sig); only while it has not been reaped

  // stdin (RunOptions::stdinPipe or stdinTerminal): writes `text` (blocking), or closes the pipe
  // (on a terminal: types the end-of-file character, Ctrl-D).
  void writeStdin(const std::string& text);
  void closeStdin();

  // RunOptions::stdoutTerminal: resizes the terminal, as a user resizing the window (the kernel
  // sends SIGWINCH to the child's session's foreground).
  void resizeTerminal(unsigned short rows, unsigned short cols);

  // Waits until pred(stdout so far, stderr so far) holds, the process exited (pred is checked one
  // last time), or the timeout passed. Returns whether pred held.
  bool waitForOutput(const std::function<bool(const std::string& out, const std::string& err)>& pred,
                     std::chrono::milliseconds timeout);
  // Waits until stdout holds at least `count` lines containing `needle`.
  bool waitForLines(const std::string& needle, size_t count, std::chrono::milliseconds timeout);

  // Waits for the exit (SIGKILL by PID at the deadline given in RunOptions, counted from start, or
  // `timeout` from now when given) and for both pipes to close (bounded: a pipe held open by a
  // leaked descendant is abandoned 2 s after the exit).
  RunResult wait(std::optional<std::chrono::milliseconds> timeout = std::nullopt);

 private:
  void readLoop();

  RunOptions options_;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  int outFd_ = -1;
  int errFd_ = -1;
  int inFd_ = -1;  // the stdin pipe's write end, or the terminal's master
  int wakeFd_[2] = {-1, -1};  // tells the reader to give up on pipes a leaked process holds
  std::chrono::steady_clock::time_point started_;
  std::thread reader_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::string out_;
  std::string err_;
  bool pipesClosed_ = false;
  bool exited_ = false;
  std::optional<RunResult> result_;
};

// Starts, waits (deadline = options.timeout), returns everything.
RunResult run(RunOptions options);

// ---- paths -------------------------------------------------------------------------------------

std::filesystem::path buildDir();              // $DRUN_BUILD_DIR (REQUIREd to be set)
std::filesystem::path drunPath();              // <build>/bin/drun
std::filesystem::path helperPath(const std::string& name);  // <build>/tests/helpers/<name>

// A fresh directory under $TMPDIR, removed recursively on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
  // Writes `content` to <dir>/<name> with the given mode; returns the path.
  std::filesystem::path write(const std::string& name, const std::string& content,
                              std::filesystem::perms mode = std::filesystem::perms::owner_read |
                                                            std::filesystem::perms::owner_write);

 private:
  std::filesystem::path path_;
};

// ---- leftover processes ------------------------------------------------------------------------

// PIDs of live (non-zombie) processes whose environment contains `needle` (e.g. "E2E_MARKER=x").
std::vector<pid_t> processesWithEnv(const std::string& needle);

// A pidfd of `pid` (pidfd_open(2)), or -1 with errno set.
int pidfdOpen(pid_t pid);

// Waits until no live process carries `needle`; returns the ones still there at the deadline.
std::vector<pid_t> waitNoProcessesWithEnv(const std::string& needle,
                                          std::chrono::milliseconds timeout);

// A unique marker for one test: pass env() to drun; leftovers() lists what still carries it; the
// destructor SIGKILLs (by PID) whatever does.
class MarkerScope {
 public:
  MarkerScope();
  ~MarkerScope();
  MarkerScope(const MarkerScope&) = delete;
  MarkerScope& operator=(const MarkerScope&) = delete;
  std::string env() const { return "E2E_MARKER=" + value_; }  // for RunOptions::env
  std::vector<pid_t> leftovers(std::chrono::milliseconds timeout) const {
    return waitNoProcessesWithEnv(env(), timeout);
  }
  // Human-readable description of leftover processes (pid, state, cmdline) for failure messages.
  static std::string describe(const std::vector<pid_t>& pids);

 private:
  std::string value_;
};

// ---- output parsing ----------------------------------------------------------------------------

std::vector<std::string> splitLines(const std::string& text);  // without the '\n'; no trailing ""
int countLinesWith(const std::string& text, const std::string& needle);  // lines containing it

// Lines of drun's console output, split into the "[r]:" rank prefix and the rest. rank is -1 for a
// line without a "[<digits>]:" prefix.
struct ConsoleLine {
  int rank = -1;
  std::string text;
};
std::vector<ConsoleLine> parseConsole(const std::string& output);

// A unique random hex string (for markers, run ids, file names).
std::string randomHex(size_t chars = 16);
// A loopback TCP port nothing uses right now, outside the ephemeral range (process_checks.cpp).
uint16_t freeLoopbackPort();

// ---- drun specifics ----------------------------------------------------------------------------

// RunOptions for `drun ARGS...` with the environment changes `env`.
RunOptions drunCommand(std::vector<std::string> args, std::vector<std::string> env = {},
                       std::chrono::milliseconds timeout = 30s);

// What one env_dump worker printed ("arg:<i>=..." and "env:KEY=VALUE" lines).
struct EnvDump {
  std::vector<std::string> args;             // argv[1..]
  std::vector<std::pair<std::string, std::string>> vars;  // in printed order (duplicates kept)
  std::optional<std::string> get(const std::string& key) const;
  size_t count(const std::string& key) const;
};
// env_dump output on drun's stdout, by console rank prefix (-1 for unprefixed lines).
std::map<int, EnvDump> parseEnvDumps(const std::string& output);

// This machine's hostname (gethostname).
std::string hostName();

}  // namespace drun::test

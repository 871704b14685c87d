// WorkerGroup: the local worker processes of one attempt (one rendezvous round) on this node.
//
// Starts N processes (fork/exec), each in its own process group, stdin from /dev/null, stdout and
// stderr through pipes into the OutputMux (whole lines, prefixed, filtered, logged to files).
// Reports each worker's exit through the onExit callback as soon as SIGCHLD arrives (no polling),
// and stops the group on request: a signal to every worker's process group, SIGKILL after the
// grace period. Descendants are covered by the JobGuard (no process outlives drun).
//
// Threading: everything runs on the io_context passed in (single-threaded); callbacks are invoked
// on it. Ownership: the group owns its pipes and child pids; destroying it SIGKILLs what is left.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace drun::agent {

// One worker to start.
struct WorkerSpec {
  int localRank = 0;
  int globalRank = 0;
  std::vector<std::string> argv;  // argv[0] resolved by the caller (path or name found in PATH)
  std::vector<std::string> env;   // the complete environment, "KEY=VALUE"
};

// Where a local rank's stdout/stderr go, torchrun's --redirects/--tee bits: 1 = stdout, 2 = stderr.
struct StdRouting {
  int redirect = 0;  // these streams go to the log file only
  int tee = 0;       // these streams go to the log file and the console
};

struct OutputOptions {
  // Console line prefix template; macros ${rank}, ${local_rank}, ${role_name}, ${hostname}.
  // Empty = no prefix. The launcher decides the default ("[${rank}]:" when >1 worker).
  std::string prefixTemplate;
  std::string roleName = "default";
  std::string hostname;
  // Local ranks whose output reaches the console; nullopt = all.
  std::optional<std::vector<int>> consoleLocalRanks;
  // Attempt directory for per-rank files: <attemptDir>/<local_rank>/{stdout,stderr}.log.
  // nullopt = no files (redirect/tee then have nowhere to write: the launcher always sets one
  // when routing is used).
  std::optional<std::filesystem::path> attemptDir;
  // Per local rank routing; ranks missing from the map use `defaultRouting`.
  StdRouting defaultRouting;
  std::map<int, StdRouting> routing;
  // How many trailing stderr lines to keep per worker for the failure summary.
  size_t stderrTailLines = 20;
};

struct WorkerExit {
  int localRank = 0;
  int globalRank = 0;
  pid_t pid = 0;
  int exitCode = 0;  // valid when signal == 0
  int signal = 0;    // the terminating signal, 0 when it exited
  std::chrono::system_clock::time_point when;
  std::deque<std::string> stderrTail;  // last lines of its stderr (complete once the pipe closed)
  bool succeeded() const { return signal == 0 && exitCode == 0; }
  // Shell convention: exitCode, or 128 + signal.
  int statusCode() const { return signal ? 128 + signal : exitCode; }
};

struct GroupOptions {
  OutputOptions output;
};

class WorkerGroup {
 public:
  using ExitHandler = std::function<void(const WorkerExit&)>;

  WorkerGroup(boost::asio::io_context& io, GroupOptions options);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Called once per worker, after the worker exited AND its stdout/stderr reached EOF (so the
  // stderr tail is complete), in the order they finish.
  void onExit(ExitHandler handler);

  // Starts every worker. Throws drun::Error when a fork/exec fails (exec failure of the program
  // is reported as an exit with code 127, like a shell, with the reason in its stderr tail).
  void start(const std::vector<WorkerSpec>& workers);

  // Sends `signal` to the process group of every live worker, then SIGKILL to the groups still
  // alive after `grace`. `done` runs once every worker was reaped.
  void stop(int signal, std::chrono::milliseconds grace, std::function<void()> done);

  size_t running() const;  // workers not yet reported through onExit
  std::vector<pid_t> pids() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace drun::agent

// WorkerGroup: the local worker processes of one attempt (one rendezvous round) on this node.
//
// Starts N processes (clone(CLONE_VM|CLONE_VFORK) + execve, like posix_spawn), each in its own
// process group, parent-death signal SIGKILL, default signal dispositions and an empty signal
// mask, stdout and stderr into the OutputMux (whole lines, prefixed, filtered, logged to files)
// through pipes, or through pseudo-terminals of their own (OutputOptions::tty; Auto: where the
// console is a terminal; isatty() is then true in the worker, the pty copies the console's window
// size and SIGWINCH is passed on), and no other inherited fd (fds >= 3 are closed). stdin is
// /dev/null, except for the worker whose global rank is OutputOptions::stdinRank: drun's stdin is
// forwarded to it through a pipe while it runs (stdin_forwarder.hpp). An exec
// failure is reported as an exit with code 127 (not found) or 126 (not executable) and the reason
// as a stderr line. Reports each worker's exit through the onExit callback as soon as SIGCHLD
// arrives (no polling), and stops the group on request: a signal to every worker's process
// group, SIGKILL after the grace period. Descendants are covered by the JobGuard (no process
// outlives drun).
//
// SIGCHLD: while a group lives, its SIGCHLD handler reaps every exited child of the process
// (waitpid(-1)); children that are not workers (orphans re-parented to drun, the subreaper) are
// dropped, the JobGuard watchdog is routed to its owner. Code that wants to wait for a child of
// its own must register it with the process-wide reaper (agent/src/child_reaper.hpp).
// The parent-death signal follows the *thread* that called start(): call it from a thread that
// outlives the workers (the agent's main thread).
//
// Threading: everything runs on the io_context passed in (single-threaded); callbacks are invoked
// on it and may destroy the group. No exception leaves the group's handlers: one thrown by a
// callback is logged as an internal error and swallowed (callbacks should not throw).
// Ownership: the group owns its pipes and child pids; destroying it SIGKILLs every worker's
// process group and reaps the workers (bounded wait).
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

#include "drun/agent/numa_binding.hpp"
#include "drun/agent/output_mux.hpp"

namespace drun::agent {

// One worker to start.
struct WorkerSpec {
  int localRank = 0;
  int globalRank = 0;
  std::vector<std::string> argv;  // argv[0] resolved by the caller (path or name found in PATH)
  std::vector<std::string> env;   // the complete environment, "KEY=VALUE"
  RankBinding binding;            // --numa-binding: its CPUs and memory nodes, set before exec
};

struct WorkerExit {
  int localRank = 0;
  int globalRank = 0;
  pid_t pid = 0;
  int exitCode = 0;  // valid when signal == 0
  int signal = 0;    // the terminating signal, 0 when it exited
  std::chrono::system_clock::time_point when;
  // It ended after drun began stopping its group: a consequence of the stop, not a root cause.
  bool afterStop = false;
  std::deque<std::string> stderrTail;  // last lines of its stderr (complete once the pipe closed)
  std::deque<std::string> stdoutTail;  // and of its stdout: the summary's when stderr is empty
  bool succeeded() const { return signal == 0 && exitCode == 0; }
  // Shell convention: exitCode, or 128 + signal.
  int statusCode() const { return signal ? 128 + signal : exitCode; }
};

class JobGuard;

struct GroupOptions {
  OutputOptions output;
  // When set, every worker's process group is registered with the guard (and unregistered once
  // the group is empty), and the guard's envEntry() is appended to each worker's environment
  // unless it already carries DRUN_JOB_TOKEN. Not owned; must outlive the group.
  JobGuard* jobGuard = nullptr;
  // After a worker exited, how long to wait for its pipes to reach EOF before reporting it anyway
  // (a grandchild may hold them open). Reading goes on after the report.
  std::chrono::milliseconds pipeDrainBound{150};
};

class WorkerGroup {
 public:
  using ExitHandler = std::function<void(const WorkerExit&)>;
  using StandbyExitHandler = std::function<void(int slot, const WorkerExit&)>;

  WorkerGroup(boost::asio::io_context& io, GroupOptions options);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Called once per worker, after the worker exited AND its stdout/stderr reached EOF (so the
  // stderr tail is complete), in the order they finish. If a descendant keeps the pipes open,
  // the report comes GroupOptions::pipeDrainBound after the exit anyway.
  void onExit(ExitHandler handler);

  // Starts every worker. Throws drun::Error when a fork/exec fails (exec failure of the program
  // is reported as an exit with code 127, like a shell, with the reason in its stderr tail).
  // On a throw, the workers started so far are SIGKILLed (destroy the group to reap them).
  // Call once per group.
  void start(const std::vector<WorkerSpec>& workers);

  // Starts one more worker into the running group (an in-process recovery's replacement: the
  // same local and global rank as a worker already reported through onExit, a new environment).
  // Its output takes the rank's place in the OutputMux (its log files go on). Returns its pid.
  // Throws drun::Error as start() does, std::logic_error before start(), while stopping, or
  // while a worker of that local rank is still running.
  pid_t add(const WorkerSpec& worker);

  // Standby workers (docs/recovery.md): processes started ahead of need under an in-process
  // recovery, each in a slot of its own, that become a rank's worker when assigned. A standby is
  // a worker in everything but its ranks: the JobGuard covers it, stop() and signalAll() reach
  // it, stop()'s `done` waits for it; its output has a prefix of its own (OutputMux::
  // attachStandby); running() and pids() leave it out, and its exit (unassigned) is reported
  // through onStandbyExit, not onExit (WorkerExit's ranks are then OutputMux::standbySource).
  void onStandbyExit(StandbyExitHandler handler);
  // Starts a standby in `slot` with spec's argv and env (its ranks are ignored). Throws as add().
  pid_t startStandby(int slot, const WorkerSpec& spec);
  // The standby in `slot` becomes the worker of (localRank, globalRank), as add() would start
  // one: exits through onExit, the rank's output prefix and log files. What tells the process
  // its ranks is the caller's. Returns its pid. Throws std::logic_error when the slot holds no
  // live standby, while stopping, or while a worker of that local rank still runs.
  pid_t assign(int slot, int localRank, int globalRank);
  // SIGKILL to every standby not assigned (a job whose workers ended needs none).
  void stopStandbys();
  std::vector<pid_t> standbyPids() const;  // the standbys not yet reported

  // Sends `signal` to the process group of every live worker, then SIGKILL to the groups still
  // alive after `grace`. `done` runs (on the io_context) once every worker was reported through
  // onExit. A second stop() while stopping sends its signal too and keeps the earlier deadline
  // unless the new one is sooner.
  void stop(int signal, std::chrono::milliseconds grace, std::function<void()> done);

  // Sends `signal` to the process group of every worker not yet reported (job control:
  // SIGSTOP / SIGCONT when drun itself is stopped and continued). Nothing else changes.
  void signalAll(int signal);

  size_t running() const;  // workers not yet reported through onExit
  std::vector<pid_t> pids() const;  // every worker's pid (= its process group id), start order;
                                    // an assigned standby in its start's place

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace drun::agent

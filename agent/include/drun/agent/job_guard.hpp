// JobGuard: guarantees that no worker process, nor any of its descendants, outlives drun, even
// when drun is SIGKILLed (a parent-death signal only reaches direct children).
//
// Mechanism: at start drun forks a tiny watchdog in its own process group that ignores terminal
// signals and blocks reading a socket (socketpair, used as a pipe: writes with MSG_NOSIGNAL) whose
// other end only drun holds (close-on-exec). drun tells it each worker's process group as it
// starts. When the socket reaches EOF (drun exited or died), the
// watchdog SIGKILLs every registered process group and every process whose environment carries
// this job's marker (DRUN_JOB_TOKEN=<token>, which also catches descendants that called setsid),
// then exits. drun also makes itself a child subreaper so orphaned descendants re-parent to it.
//
// The watchdog is forked (no exec) before anything else, so it holds none of the workers' pipes; it
// closes every fd but its socket, makes only raw system calls, and sweeps by repeating the scan a
// bounded number of times to catch processes forked meanwhile. If it dies, the next message finds
// out (EPIPE, no SIGPIPE) and a new one is forked with the registered groups replayed.
// Protocol on the socket, one line each: "+<pgid>", "-<pgid>", "sweep" (sweep now, then exit),
// and "n..." lines that hand it this process's death notice (death_notice.hpp: the etcd lease's
// revoke), which it sends after the sweep when drun died; a release withdraws it first.
// Limits: a descendant that rewrites its environment from scratch (env -i) and leaves the worker's
// process group is not found here (while drun lives it is drun's child, the subreaper's, and the
// agent kills it at the job's end: orphan_sweep.hpp); the marker is matched as a whole
// "DRUN_JOB_TOKEN=<token>" entry.
//
// Threading: call from the agent's thread only. Ownership: one per drun process; the watchdog is a
// child of drun registered with the process-wide reaper, so WorkerGroup's SIGCHLD handling never
// mistakes it for a worker.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace drun::agent {

class JobGuard {
 public:
  // Forks the watchdog. `token` is a random marker put in every worker's environment as
  // DRUN_JOB_TOKEN.
  static JobGuard start();
  JobGuard(JobGuard&&) noexcept;
  JobGuard& operator=(JobGuard&&) noexcept;
  // On a normal exit: tells the watchdog to sweep (same as EOF) and reaps it (bounded: 2 s, then
  // SIGKILL). Costs the sweep (~1-2 ms).
  ~JobGuard();

  const std::string& token() const { return token_; }
  // Environment entry to add to every worker: "DRUN_JOB_TOKEN=<token>".
  std::string envEntry() const;

  void addProcessGroup(pid_t pgid);
  void removeProcessGroup(pid_t pgid);

  // Kills every process of this job that is still alive (by group and by marker), now, in this
  // process (synchronous, bounded); the watchdog keeps guarding. Used at the end of a normal run,
  // after the workers were reaped, or between rounds to clear leftovers. Costs about two /proc
  // scans (~1 ms with 100 processes). The destructor sweeps anyway (through the watchdog).
  void sweep();

  pid_t watchdogPid() const { return watchdogPid_; }  // -1 when none (for tests and diagnostics)

 private:
  JobGuard() = default;
  void spawnWatchdog();
  void notify(const std::string& line);  // to the watchdog; respawns it once if it died
  void release();                        // EOF to the watchdog, then reap it (bounded)
  void attachNotice();                   // the death notice follows to the watchdog
  void followNotice();                   // (re)registers the sink writing to noticeFd_
  void detachNotice(bool withdraw);      // withdraw: the watchdog forgets it too
  std::string token_;
  int writeFd_ = -1;
  pid_t watchdogPid_ = -1;
  int noticeFd_ = -1;  // a second descriptor of the socket, for the death notice's publishers
  std::vector<pid_t> groups_;  // registered process groups, replayed to a respawned watchdog
};

}  // namespace drun::agent

// JobGuard: guarantees that no worker process, nor any of its descendants, outlives drun, even
// when drun is SIGKILLed (a parent-death signal only reaches direct children).
//
// Mechanism: at start drun forks a tiny watchdog in its own process group that ignores terminal
// signals and blocks reading a pipe whose write end only drun holds (close-on-exec). drun tells it
// each worker's process group as it starts. When the pipe reaches EOF (drun exited or died), the
// watchdog SIGKILLs every registered process group and every process whose environment carries
// this job's marker (DRUN_JOB_TOKEN=<token>, which also catches descendants that called setsid),
// then exits. drun also makes itself a child subreaper so orphaned descendants re-parent to it.
//
// Threading: call from the agent's thread only. Ownership: one per drun process.
#pragma once

#include <sys/types.h>

#include <string>

namespace drun::agent {

class JobGuard {
 public:
  // Forks the watchdog. `token` is a random marker put in every worker's environment as
  // DRUN_JOB_TOKEN.
  static JobGuard start();
  JobGuard(JobGuard&&) noexcept;
  JobGuard& operator=(JobGuard&&) noexcept;
  ~JobGuard();  // on a normal exit: tells the watchdog to sweep (same as EOF) and reaps it

  const std::string& token() const { return token_; }
  // Environment entry to add to every worker: "DRUN_JOB_TOKEN=<token>".
  std::string envEntry() const;

  void addProcessGroup(pid_t pgid);
  void removeProcessGroup(pid_t pgid);

  // Kills every process of this job that is still alive (by group and by marker), now.
  // Used at the end of a normal run, after the workers were reaped.
  void sweep();

 private:
  JobGuard() = default;
  std::string token_;
  int writeFd_ = -1;
  pid_t watchdogPid_ = -1;
};

}  // namespace drun::agent

// ChildReaper: the process-wide record of which child pids belong to whom.
//
// A SIGCHLD handler must reap with waitpid(-1) (orphans re-parented to drun, the child subreaper,
// have pids nobody knows), which would steal the exit status of children other code owns. So every
// owner registers its children here, and whoever reaps routes each status through this registry:
// watched pids go to their sink, the others (orphans) are dropped.
//
// Threading: thread-safe (one mutex). Sinks run with the registry lock held, on the reaping
// thread: they must only hand the status on (post to an executor, store it), never block or call
// back into the reaper. Ownership: a process-wide singleton.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <unordered_map>

namespace drun::agent::detail {

class ChildReaper {
 public:
  using ExitSink = std::function<void(pid_t pid, int waitStatus)>;

  static ChildReaper& instance();

  // Runs `spawn` (returns the child's pid, or -1 without a child) under the lock, so no reaper
  // can collect the child before it is registered, and routes its exit status to `sink`.
  pid_t spawnWatched(const std::function<pid_t()>& spawn, ExitSink sink);

  // Reaps every exited child (waitpid(-1, WNOHANG) until none is left).
  void reapAll();

  // Waits up to `timeout` for `pid` to exit (pidfd + poll), then collects it. True once its
  // status was collected, here or by reapAll(); the pid is no longer watched. Its status is
  // dropped: the callers only need the child gone.
  bool reapWithin(pid_t pid, std::chrono::milliseconds timeout);

  // Stops routing `pid` (its status will be dropped when reaped).
  void forget(pid_t pid);

 private:
  bool tryReap(pid_t pid);  // reapWithin() without the wait (WNOHANG)

  std::mutex mutex_;
  std::unordered_map<pid_t, ExitSink> watched_;
};

// Waits up to `timeout` for `pid` (a child or any process) to exit, without reaping it. Returns
// true when it exited. Uses a pidfd; falls back to short naps where pidfds are missing.
bool waitForExit(pid_t pid, std::chrono::milliseconds timeout);

}  // namespace drun::agent::detail

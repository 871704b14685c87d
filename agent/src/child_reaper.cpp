#include "child_reaper.hpp"

#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

#include "drun/common/deadline.hpp"

namespace drun::agent::detail {

ChildReaper& ChildReaper::instance() {
  static ChildReaper reaper;
  return reaper;
}

pid_t ChildReaper::spawnWatched(const std::function<pid_t()>& spawn, ExitSink sink) {
  std::lock_guard lock(mutex_);
  pid_t pid = spawn();
  if (pid > 0) watched_[pid] = std::move(sink);
  return pid;
}

void ChildReaper::reapAll() {
  std::lock_guard lock(mutex_);
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;  // 0: children left but none exited; -1/ECHILD: no children at all
    auto it = watched_.find(pid);
    if (it == watched_.end()) continue;  // an orphan re-parented to us: reaped, nothing to report
    ExitSink sink = std::move(it->second);
    watched_.erase(it);
    if (sink) sink(pid, status);
  }
}

bool ChildReaper::tryReap(pid_t pid) {
  std::lock_guard lock(mutex_);
  auto it = watched_.find(pid);
  if (it == watched_.end()) return true;  // collected (and routed) earlier
  int status = 0;
  pid_t got;
  do got = ::waitpid(pid, &status, WNOHANG);
  while (got < 0 && errno == EINTR);
  if (got == 0) return false;
  watched_.erase(it);
  return true;  // got == pid, or ECHILD: not our child (any more)
}

bool ChildReaper::reapWithin(pid_t pid, std::chrono::milliseconds timeout) {
  if (tryReap(pid)) return true;
  waitForExit(pid, timeout);
  return tryReap(pid);
}

void ChildReaper::forget(pid_t pid) {
  std::lock_guard lock(mutex_);
  watched_.erase(pid);
}

bool waitForExit(pid_t pid, std::chrono::milliseconds timeout) {
  Deadline deadline(timeout);
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd >= 0) {
    bool exited = false;
    for (;;) {
      pollfd p{pidfd, POLLIN, 0};
      int ms = static_cast<int>(std::min<long long>(deadline.remaining().count(), 1 << 30));
      int r = ::poll(&p, 1, ms);
      if (r < 0 && errno == EINTR) continue;
      exited = r > 0;
      break;
    }
    ::close(pidfd);
    return exited;
  }
  if (errno == ESRCH) return true;  // already gone (reaped)
  // No pidfds (kernel < 5.3): look without reaping, with short naps. Not on the normal path.
  for (;;) {
    siginfo_t info{};
    int r = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
    if (r < 0 && errno != EINTR) return ::kill(pid, 0) != 0;  // not our child: is it gone?
    if (r == 0 && info.si_pid == pid) return true;
    if (deadline.expired()) return false;
    timespec nap{0, 1'000'000};
    ::nanosleep(&nap, nullptr);
  }
}

}  // namespace drun::agent::detail

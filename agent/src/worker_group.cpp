#include "drun/agent/worker_group.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstring>
#include <unordered_map>

#include "child_reaper.hpp"
#include "handler_guard.hpp"
#include "drun/agent/job_guard.hpp"
#include "drun/common/deadline.hpp"
#include "drun/common/error.hpp"
#include "worker_group_impl.hpp"

namespace drun::agent {

namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

// How long the destructor waits for SIGKILLed workers to die before leaving them to the reaper.
constexpr std::chrono::milliseconds kDestructorReapBound = 2s;
// How often the group reaps without a SIGCHLD while its workers run (sweepReaps()).
constexpr std::chrono::milliseconds kReapSweep = 1s;

// fds 0-2 must be taken, or a pipe could land on them and be clobbered by the child's dup2s.
void ensureStandardFdsOpen() {
  for (int fd = 0; fd < 3; ++fd) {
    if (::fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
    int null = ::open("/dev/null", O_RDWR);  // lands on `fd`, the lowest free number
    if (null >= 0 && null != fd) ::close(null);
  }
}

// Asio (1.74) installs its SIGCHLD handler without SA_RESTART, so every worker exit would make
// blocking calls elsewhere in drun (a synchronous store read, fread, waitpid) fail with EINTR.
// Same handler, plus SA_RESTART, and SA_NOCLDSTOP (stopped/continued workers are not exits).
void restartSyscallsOnSigchld() {
  struct sigaction sa;
  if (::sigaction(SIGCHLD, nullptr, &sa) != 0) return;
  if (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN) return;
  sa.sa_flags |= SA_RESTART | SA_NOCLDSTOP;
  ::sigaction(SIGCHLD, &sa, nullptr);
}

}  // namespace

WorkerGroup::Impl::Impl(asio::io_context& io, GroupOptions options)
    : io(io),
      options(std::move(options)),
      mux(io, this->options.output),
      sigchld(io, SIGCHLD),
      winch(io),
      killTimer(io),
      reapSweep(io) {
  ensureStandardFdsOpen();
  devNull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devNull < 0) throw Error(std::string("cannot open /dev/null: ") + std::strerror(errno));
  restartSyscallsOnSigchld();
  waitForSigchld();
}

WorkerGroup::Impl::~Impl() {
  life.reset();  // handlers still queued on the io_context must not touch us
  boost::system::error_code ignored;
  sigchld.cancel(ignored);
  // SIGKILL every group (leftover descendants of exited workers included), then reap.
  for (auto& w : workers)
    if (w->pid > 0 && !w->groupGone) killGroup(*w, SIGKILL);
  auto& reaper = detail::ChildReaper::instance();
  Deadline deadline(kDestructorReapBound);
  for (auto& w : workers) {
    if (w->pid <= 0 || w->exited) continue;
    if (!reaper.reapWithin(w->pid, deadline.remaining())) {
      spdlog::warn("worker pid {} (local rank {}) did not die within {}ms of SIGKILL", w->pid,
                   w->localRank, kDestructorReapBound.count());
      reaper.forget(w->pid);
    }
  }
  if (options.jobGuard)
    for (auto& w : workers)
      if (w->pid > 0 && !w->groupGone) options.jobGuard->removeProcessGroup(w->pid);
  if (devNull >= 0) ::close(devNull);
  for (auto& w : workers)
    for (int fd : w->ptyControl)
      if (fd >= 0) ::close(fd);
}

void WorkerGroup::Impl::waitForSigchld() {
  sigchld.async_wait([this, alive = guard()](const boost::system::error_code& ec, int) {
    if (alive.expired() || ec) return;
    detail::guarded("the SIGCHLD handler", [&] {
      waitForSigchld();
      // Routes every exited child: ours come back through their sinks (posted), others dropped.
      detail::ChildReaper::instance().reapAll();
    });
  });
}

void WorkerGroup::Impl::sweepReaps() {
  reapSweep.expires_after(kReapSweep);
  reapSweep.async_wait([this, alive = guard()](const boost::system::error_code& ec) {
    if (alive.expired() || ec) return;
    detail::guarded("the reap sweep", [&] {
      detail::ChildReaper::instance().reapAll();
      if (live() > 0) sweepReaps();
    });
  });
}

void WorkerGroup::Impl::start(const std::vector<WorkerSpec>& specs) {
  if (started) throw std::logic_error("WorkerGroup::start called twice");
  started = true;
  resolveTty();
  workers.reserve(specs.size());
  try {
    for (const auto& spec : specs) startOne(spec);
  } catch (...) {
    for (auto& w : workers) killGroup(*w, SIGKILL);
    throw;
  }
  // Children that exited while no group listened (orphans) left zombies: collect them now.
  detail::ChildReaper::instance().reapAll();
  sweepReaps();
}

pid_t WorkerGroup::Impl::add(const WorkerSpec& spec) {
  if (!started) throw std::logic_error("WorkerGroup::add before start");
  if (stopping) throw std::logic_error("WorkerGroup::add while the group stops");
  for (const auto& w : workers)
    if (w->localRank == spec.localRank && !w->reported)
      throw std::logic_error("WorkerGroup::add: local rank " + std::to_string(spec.localRank) +
                             " still runs");
  startOne(spec, Attach::Replacing);
  sweepReaps();
  return workers.back()->pid;
}

pid_t WorkerGroup::Impl::startStandby(int slot, const WorkerSpec& spec) {
  if (!started) throw std::logic_error("WorkerGroup::startStandby before start");
  if (stopping) throw std::logic_error("WorkerGroup::startStandby while the group stops");
  if (slot < 0 || findStandby(slot)) throw std::logic_error("WorkerGroup::startStandby: slot in use");
  WorkerSpec standby = spec;
  standby.localRank = standby.globalRank = OutputMux::standbySource(slot);
  startOne(standby, Attach::Standby, slot);
  sweepReaps();
  return workers.back()->pid;
}

pid_t WorkerGroup::Impl::assign(int slot, int localRank, int globalRank) {
  Worker* standby = findStandby(slot);
  if (!standby || standby->exited) throw std::logic_error("WorkerGroup::assign: no live standby in that slot");
  if (stopping) throw std::logic_error("WorkerGroup::assign while the group stops");
  for (const auto& w : workers)
    if (w->localRank == localRank && !w->reported)
      throw std::logic_error("WorkerGroup::assign: local rank " + std::to_string(localRank) + " still runs");
  mux.adopt(slot, localRank, globalRank);
  standby->localRank = localRank;
  standby->globalRank = globalRank;
  standby->standbySlot = -1;
  // Its stdin: drun's when it is the rank that reads it, else the end of the file, as /dev/null.
  if (standby->stdinHeld.write >= 0 && options.output.stdinRank == globalRank)
    forwardStdin(*standby, standby->stdinHeld.releaseWrite());
  standby->stdinHeld.closeWrite();
  spdlog::debug("standby {} pid {} is now worker local rank {} rank {}", slot, standby->pid, localRank,
                globalRank);
  return standby->pid;
}

void WorkerGroup::Impl::reaped(pid_t pid, int status) {
  auto it = byPid.find(pid);
  if (it == byPid.end()) return;
  Worker& w = *it->second;
  if (w.exited) return;
  w.exited = true;
  w.when = std::chrono::system_clock::now();
  if (WIFSIGNALED(status))
    w.signal = WTERMSIG(status);
  else
    w.exitCode = WEXITSTATUS(status);
  spdlog::debug("worker local rank {} pid {} exited: code {} signal {}", w.localRank, pid,
                w.exitCode, w.signal);
  w.stdinForwarder.reset();  // the worker reads no more: neither does drun
  w.stdinHeld.closeWrite();
  mux.sweep(w.localRank);  // its last lines, even from pipes paused by back-pressure
  if (mux.closed(w.localRank)) return report(w);
  // A descendant may hold the pipes open: report after a short bound anyway (reading goes on).
  w.drainTimer.emplace(io, options.pipeDrainBound);
  w.drainTimer->async_wait([this, &w, alive = guard()](const boost::system::error_code& ec) {
    if (alive.expired() || ec) return;
    detail::guarded("a worker exit", [&] { report(w); });
  });
}

void WorkerGroup::Impl::report(Worker& w) {
  if (w.reported) return;
  w.reported = true;
  if (w.drainTimer) w.drainTimer->cancel();
  // An empty group's id may be reused once the leader is reaped: never signal it again. A
  // group with members left keeps its id reserved (the kernel does not reuse it meanwhile).
  w.groupGone = ::kill(-w.pid, 0) != 0 && errno == ESRCH;
  if (options.jobGuard && w.groupGone) options.jobGuard->removeProcessGroup(w.pid);
  WorkerExit exit;
  exit.localRank = w.localRank;
  exit.globalRank = w.globalRank;
  exit.pid = w.pid;
  exit.exitCode = w.exitCode;
  exit.signal = w.signal;
  exit.when = w.when;
  exit.afterStop = stopping && w.when >= stopRequestedWall;
  exit.stderrTail = mux.stderrTail(w.localRank);
  exit.stdoutTail = mux.stdoutTail(w.localRank);
  auto alive = guard();
  if (w.standbySlot >= 0) {
    if (onStandbyExit) onStandbyExit(w.standbySlot, exit);  // may destroy the group
  } else if (onExit) {
    onExit(exit);  // may destroy the group
  }
  if (alive.expired()) return;
  maybeStopDone();
}

void WorkerGroup::Impl::stop(int sig, std::chrono::milliseconds grace, std::function<void()> done) {
  if (done) stopDone.push_back(std::move(done));
  for (auto& w : workers)
    if (!w->reported) killGroup(*w, sig);  // exited but unreported: descendants hold its pipes
  auto at = std::chrono::steady_clock::now() + grace;
  if (!stopping) stopRequestedWall = std::chrono::system_clock::now();
  if (!stopping || at < killAt) {
    stopping = true;
    killAt = at;
    killTimer.expires_at(at);
    killTimer.async_wait([this, alive = guard()](const boost::system::error_code& ec) {
      if (alive.expired() || ec) return;
      for (auto& w : workers)
        if (!w->reported) {
          if (!w->exited) spdlog::debug("worker pid {} still alive after grace: SIGKILL", w->pid);
          killGroup(*w, SIGKILL);
        }
    });
  }
  if (live() == 0) {
    // Nothing to wait for: still complete asynchronously, like every other path.
    asio::post(io, [this, alive = guard()] {
      if (!alive.expired()) detail::guarded("stopping the workers", [&] { maybeStopDone(); });
    });
  }
}

void WorkerGroup::Impl::maybeStopDone() {
  if (!stopping || live() != 0 || stopDone.empty()) return;
  killTimer.cancel();
  auto callbacks = std::move(stopDone);
  stopDone.clear();
  stopping = false;
  auto alive = guard();
  for (auto& cb : callbacks) {
    cb();  // may destroy the group
    if (alive.expired()) return;
  }
}

WorkerGroup::WorkerGroup(asio::io_context& io, GroupOptions options)
    : impl_(std::make_unique<Impl>(io, std::move(options))) {}

WorkerGroup::~WorkerGroup() = default;

void WorkerGroup::onExit(ExitHandler handler) { impl_->onExit = std::move(handler); }

void WorkerGroup::start(const std::vector<WorkerSpec>& workers) { impl_->start(workers); }

pid_t WorkerGroup::add(const WorkerSpec& worker) { return impl_->add(worker); }

void WorkerGroup::stop(int signal, std::chrono::milliseconds grace, std::function<void()> done) {
  impl_->stop(signal, grace, std::move(done));
}

void WorkerGroup::signalAll(int signal) {
  for (auto& w : impl_->workers)
    if (!w->reported) impl_->killGroup(*w, signal);
}

void WorkerGroup::onStandbyExit(StandbyExitHandler handler) { impl_->onStandbyExit = std::move(handler); }

pid_t WorkerGroup::startStandby(int slot, const WorkerSpec& spec) { return impl_->startStandby(slot, spec); }

pid_t WorkerGroup::assign(int slot, int localRank, int globalRank) {
  return impl_->assign(slot, localRank, globalRank);
}

void WorkerGroup::stopStandbys() {
  for (auto& w : impl_->workers)
    if (w->standbySlot >= 0 && !w->reported) impl_->killGroup(*w, SIGKILL);
}

std::vector<pid_t> WorkerGroup::standbyPids() const {
  std::vector<pid_t> out;
  for (const auto& w : impl_->workers)
    if (w->standbySlot >= 0 && !w->reported) out.push_back(w->pid);
  return out;
}

size_t WorkerGroup::running() const { return impl_->running(); }

std::vector<pid_t> WorkerGroup::pids() const {
  std::vector<pid_t> out;
  for (const auto& w : impl_->workers)
    if (w->standbySlot < 0) out.push_back(w->pid);
  return out;
}

}  // namespace drun::agent

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
#include "process_spawn.hpp"
#include "pty.hpp"
#include "worker_pipes.hpp"
#include "stdin_forwarder.hpp"

namespace drun::agent {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using detail::Pipe;

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

bool hasJobToken(const std::vector<std::string>& env) {
  for (const auto& entry : env)
    if (entry.rfind("DRUN_JOB_TOKEN=", 0) == 0) return true;
  return false;
}

}  // namespace

struct WorkerGroup::Impl {
  struct Worker {
    int localRank = 0;
    int globalRank = 0;
    int standbySlot = -1;  // >= 0: a standby not assigned yet (local/global rank: its mux source)
    pid_t pid = -1;
    bool exited = false;
    int exitCode = 0;
    int signal = 0;
    std::chrono::system_clock::time_point when;
    bool reported = false;
    bool groupGone = false;  // its process group was empty once it was reported
    std::unique_ptr<detail::StdinForwarder> stdinForwarder;  // drun's stdin, while it runs
    Pipe stdinHeld{Pipe::Closed{}};  // a standby's stdin pipe: forwarded to if it takes the stdin rank
    int ptyControl[2] = {-1, -1};  // dups of its stdout / stderr pty masters: window sizes
    std::optional<asio::steady_timer> drainTimer;  // the bound on pipes held by descendants
  };

  Impl(asio::io_context& io, GroupOptions options)
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

  ~Impl() {
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

  asio::io_context& io;
  GroupOptions options;
  OutputMux mux;
  asio::signal_set sigchld;
  asio::signal_set winch;  // SIGWINCH, while workers have ptys sized after drun's terminal
  asio::steady_timer killTimer;
  asio::steady_timer reapSweep;
  bool ttyOut = false;  // worker stdout / stderr are ptys (TtyMode, resolved at start)
  bool ttyErr = false;
  std::vector<std::unique_ptr<Worker>> workers;
  std::unordered_map<pid_t, Worker*> byPid;
  ExitHandler onExit;
  StandbyExitHandler onStandbyExit;
  std::vector<std::function<void()>> stopDone;
  bool stopping = false;
  std::chrono::steady_clock::time_point killAt;
  std::chrono::system_clock::time_point stopRequestedWall;  // the first stop(): exits' `afterStop`
  bool started = false;
  int devNull = -1;
  std::shared_ptr<int> life = std::make_shared<int>(0);

  auto guard() { return std::weak_ptr<int>(life); }

  void waitForSigchld() {
    sigchld.async_wait([this, alive = guard()](const boost::system::error_code& ec, int) {
      if (alive.expired() || ec) return;
      detail::guarded("the SIGCHLD handler", [&] {
        waitForSigchld();
        // Routes every exited child: ours come back through their sinks (posted), others dropped.
        detail::ChildReaper::instance().reapAll();
      });
    });
  }

  // A backstop for SIGCHLD: while a worker runs, reap every kReapSweep as the handler does. A
  // missed exit would hang the job, and a signal can come late (ThreadSanitizer delivers them at
  // points of its own, seconds later). A sweep of nothing
  // exited is one waitpid(WNOHANG).
  void sweepReaps() {
    reapSweep.expires_after(kReapSweep);
    reapSweep.async_wait([this, alive = guard()](const boost::system::error_code& ec) {
      if (alive.expired() || ec) return;
      detail::guarded("the reap sweep", [&] {
        detail::ChildReaper::instance().reapAll();
        if (live() > 0) sweepReaps();
      });
    });
  }

  void killGroup(const Worker& w, int sig) {
    if (::kill(-w.pid, sig) != 0 && errno != ESRCH)
      spdlog::debug("kill(-{}, {}) failed: {}", w.pid, sig, std::strerror(errno));
  }

  void start(const std::vector<WorkerSpec>& specs) {
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

  pid_t add(const WorkerSpec& spec) {
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

  pid_t startStandby(int slot, const WorkerSpec& spec) {
    if (!started) throw std::logic_error("WorkerGroup::startStandby before start");
    if (stopping) throw std::logic_error("WorkerGroup::startStandby while the group stops");
    if (slot < 0 || findStandby(slot)) throw std::logic_error("WorkerGroup::startStandby: slot in use");
    WorkerSpec standby = spec;
    standby.localRank = standby.globalRank = OutputMux::standbySource(slot);
    startOne(standby, Attach::Standby, slot);
    sweepReaps();
    return workers.back()->pid;
  }

  Worker* findStandby(int slot) const {
    for (const auto& w : workers)
      if (w->standbySlot == slot) return w.get();
    return nullptr;
  }

  pid_t assign(int slot, int localRank, int globalRank) {
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

  ConsoleWriter& console() const {
    return options.output.console ? *options.output.console : *ConsoleWriter::standard();
  }

  // TtyMode::Auto: a pty for each stream whose console is a terminal (as a worker started from
  // the shell would have).
  void resolveTty() {
    const OutputOptions& o = options.output;
    ttyOut = o.tty == TtyMode::Always ||
             (o.tty == TtyMode::Auto && ::isatty(console().fd(ConsoleStream::Out)) == 1);
    ttyErr = o.tty == TtyMode::Always ||
             (o.tty == TtyMode::Auto && ::isatty(console().fd(ConsoleStream::Err)) == 1);
    if ((ttyOut || ttyErr) && windowSize()) {
      winch.add(SIGWINCH);
      watchWindowSize();
    }
  }

  // The size of drun's terminal (stdout's, else stderr's), which the workers' ptys copy.
  std::optional<winsize> windowSize() const {
    if (auto size = detail::terminalSize(console().fd(ConsoleStream::Out))) return size;
    return detail::terminalSize(console().fd(ConsoleStream::Err));
  }

  // The ptys are nobody's controlling terminal (pty.hpp), so the kernel signals nobody when their
  // size changes: drun passes its terminal's new size on and tells each worker's group.
  void watchWindowSize() {
    winch.async_wait([this, alive = guard()](const boost::system::error_code& ec, int) {
      if (alive.expired() || ec) return;
      detail::guarded("a window-size change", [&] {
        auto size = windowSize();
        for (auto& w : workers) {
          if (w->reported || !size) continue;
          for (int fd : w->ptyControl)
            if (fd >= 0) ::ioctl(fd, TIOCSWINSZ, &*size);
          killGroup(*w, SIGWINCH);
        }
        watchWindowSize();
      });
    });
  }

  enum class Attach { Fresh, Replacing, Standby };

  void forwardStdin(Worker& w, int pipeWrite) {
    auto console = options.output.console ? options.output.console : ConsoleWriter::standard();
    w.stdinForwarder = std::make_unique<detail::StdinForwarder>(io, options.output.stdinFd, pipeWrite,
                                                                [console] { console->lineEndedOutside(); });
  }

  void startOne(const WorkerSpec& spec, Attach how = Attach::Fresh, int slot = -1) {
    if (spec.argv.empty())
      throw InvalidArgument("worker local rank " + std::to_string(spec.localRank) + ": empty argv");
    if (how != Attach::Standby) mux.prepare(spec.localRank, spec.globalRank);  // log files before it runs
    const auto size = ttyOut || ttyErr ? windowSize() : std::nullopt;
    Pipe out = Pipe::output(ttyOut, size);
    std::optional<Pipe> err;  // none: stderr shares stdout's pipe, in the order written
    if (!mergeStreams()) err.emplace(Pipe::output(ttyErr, size));
    const int errWrite = err ? err->write : out.write;
    // drun's stdin goes to one rank (through a pipe even when stdout is a pty: drun's terminal
    // already does the line editing and echo); every other worker reads /dev/null.
    std::optional<Pipe> in;
    // A standby may become that rank: its stdin is a pipe kept until its assignment.
    if (how == Attach::Standby ? options.output.stdinRank.has_value() : options.output.stdinRank == spec.globalRank)
      in.emplace();

    detail::SpawnRequest request;
    int resolveError = 0;
    request.path = detail::resolveProgram(spec.argv[0], spec.env, &resolveError);
    request.argv = spec.argv;
    request.env = spec.env;
    request.binding = spec.binding;
    if (options.jobGuard && !hasJobToken(spec.env))
      request.env.push_back(options.jobGuard->envEntry());
    request.stdinFd = in ? in->read : devNull;
    request.stdoutFd = out.write;
    request.stderrFd = errWrite;

    auto worker = std::make_unique<Worker>();
    worker->localRank = spec.localRank;
    worker->globalRank = spec.globalRank;
    worker->standbySlot = slot;
    Worker* w = worker.get();
    detail::SpawnResult result;
    auto executor = io.get_executor();
    detail::ChildReaper::instance().spawnWatched(
        [&] {
          result = detail::spawnProcess(request);
          return result.pid;
        },
        [this, executor, alive = guard()](pid_t pid, int status) {
          asio::post(executor, [this, alive, pid, status] {
            if (!alive.expired()) detail::guarded("a worker exit", [&] { reaped(pid, status); });
          });
        });
    if (result.pid < 0)
      throw Error("cannot start worker local rank " + std::to_string(spec.localRank) + " (" +
                  spec.argv[0] + "): " + result.step + ": " + std::strerror(result.error));
    w->pid = result.pid;
    byPid[w->pid] = w;
    workers.push_back(std::move(worker));
    if (result.error != 0) {
      // Like a shell: the reason on the worker's stderr, the child already _exit()ed 127/126.
      std::string reason =
          std::string("drun: cannot execute '") + spec.argv[0] +
          "': " + (std::strcmp(result.step, "execve") == 0 ? "" : std::string(result.step) + ": ") +
          std::strerror(result.error) + (resolveError == ENOENT ? " (not found in PATH)" : "") +
          (result.error == ENOEXEC ? " (a script needs a first line naming its interpreter, "
                                     "e.g. #!/bin/sh or #!/usr/bin/env python3)"
                                   : "") +
          "\n";
      [[maybe_unused]] ssize_t n = ::write(errWrite, reason.data(), reason.size());
    }
    out.closeWrite();
    if (err) err->closeWrite();
    if (in) {
      in->closeRead();
      if (how == Attach::Standby)
        w->stdinHeld = std::move(*in);
      else
        forwardStdin(*w, in->releaseWrite());
    }
    if (ttyOut) w->ptyControl[0] = ::fcntl(out.read, F_DUPFD_CLOEXEC, 3);
    if (ttyErr && err) w->ptyControl[1] = ::fcntl(err->read, F_DUPFD_CLOEXEC, 3);
    if (options.jobGuard) options.jobGuard->addProcessGroup(w->pid);
    auto onClosed = [this, w, alive = guard()] {
      if (!alive.expired() && w->exited) report(*w);
    };
    const int stderrRead = err ? err->releaseRead() : -1;
    if (how == Attach::Standby)
      mux.attachStandby(slot, out.releaseRead(), stderrRead, std::move(onClosed));
    else if (how == Attach::Replacing)
      mux.reattach(spec.localRank, spec.globalRank, out.releaseRead(), stderrRead, std::move(onClosed));
    else
      mux.attach(spec.localRank, spec.globalRank, out.releaseRead(), stderrRead, std::move(onClosed));
    if (how == Attach::Standby)
      spdlog::debug("started standby {} pid {}: {}", slot, w->pid, spec.argv[0]);
    else
      spdlog::debug("started worker local rank {} rank {} pid {}: {}", spec.localRank,
                    spec.globalRank, w->pid, spec.argv[0]);
  }

  // A worker's stdout and stderr share one pipe (or pty) when drun's console is one destination
  // for both (a terminal, `2>&1`), so that their order is the order the worker wrote in, as in a
  // shell; per-rank log files keep the streams apart (then two pipes, as before).
  bool mergeStreams() const {
    return console().sharedDestination() && !options.output.attemptDir && ttyOut == ttyErr;
  }

  void reaped(pid_t pid, int status) {
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

  void report(Worker& w) {
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

  size_t running() const {
    size_t n = 0;
    for (const auto& w : workers) n += !w->reported && w->standbySlot < 0;
    return n;
  }

  size_t live() const {  // workers and standbys not yet reported
    size_t n = 0;
    for (const auto& w : workers) n += !w->reported;
    return n;
  }

  void stop(int sig, std::chrono::milliseconds grace, std::function<void()> done) {
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

  void maybeStopDone() {
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
};

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

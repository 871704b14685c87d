// WorkerGroup::Impl: the worker processes of one group and their bookkeeping. worker_group.cpp
// holds the group's life (reaping, reports, stop) and the public API; worker_group_start.cpp
// starts one worker (its pipes or ptys, its stdin, the spawn) and follows drun's terminal size.
//
// Threading: everything on the io_context's thread; handlers hold `life` weakly, so none runs
// once the Impl is gone.
#pragma once

#include <signal.h>
#include <sys/ioctl.h>
#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include <spdlog/spdlog.h>

#include "drun/agent/output_mux.hpp"
#include "drun/agent/worker_group.hpp"
#include "stdin_forwarder.hpp"
#include "worker_pipes.hpp"

namespace drun::agent {

struct WorkerGroup::Impl {
  using Pipe = detail::Pipe;

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
    std::optional<boost::asio::steady_timer> drainTimer;  // the bound on pipes held by descendants
  };

  Impl(boost::asio::io_context& io, GroupOptions options);
  ~Impl();

  boost::asio::io_context& io;
  GroupOptions options;
  OutputMux mux;
  boost::asio::signal_set sigchld;
  boost::asio::signal_set winch;  // SIGWINCH, while workers have ptys sized after drun's terminal
  boost::asio::steady_timer killTimer;
  boost::asio::steady_timer reapSweep;
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

  // The group's life (worker_group.cpp).
  void waitForSigchld();
  // A backstop for SIGCHLD: while a worker runs, reap every kReapSweep as the handler does. A
  // missed exit would hang the job, and a signal can come late (ThreadSanitizer delivers them at
  // points of its own, seconds later). A sweep of nothing exited is one waitpid(WNOHANG).
  void sweepReaps();
  void start(const std::vector<WorkerSpec>& specs);
  pid_t add(const WorkerSpec& spec);
  pid_t startStandby(int slot, const WorkerSpec& spec);
  pid_t assign(int slot, int localRank, int globalRank);
  void reaped(pid_t pid, int status);
  void report(Worker& w);
  void stop(int sig, std::chrono::milliseconds grace, std::function<void()> done);
  void maybeStopDone();

  // Starting one worker (worker_group_start.cpp).
  enum class Attach { Fresh, Replacing, Standby };
  void startOne(const WorkerSpec& spec, Attach how = Attach::Fresh, int slot = -1);
  void forwardStdin(Worker& w, int pipeWrite);
  // TtyMode::Auto: a pty for each stream whose console is a terminal (as a worker started from
  // the shell would have).
  void resolveTty();
  // The size of drun's terminal (stdout's, else stderr's), which the workers' ptys copy.
  std::optional<winsize> windowSize() const;
  // The ptys are nobody's controlling terminal (pty.hpp), so the kernel signals nobody when their
  // size changes: drun passes its terminal's new size on and tells each worker's group.
  void watchWindowSize();

  // A worker's stdout and stderr share one pipe (or pty) when drun's console is one destination
  // for both (a terminal, `2>&1`), so that their order is the order the worker wrote in, as in a
  // shell; per-rank log files keep the streams apart (then two pipes, as before).
  bool mergeStreams() const {
    return console().sharedDestination() && !options.output.attemptDir && ttyOut == ttyErr;
  }

  ConsoleWriter& console() const {
    return options.output.console ? *options.output.console : *ConsoleWriter::standard();
  }

  void killGroup(const Worker& w, int sig) {
    if (::kill(-w.pid, sig) != 0 && errno != ESRCH)
      spdlog::debug("kill(-{}, {}) failed: {}", w.pid, sig, std::strerror(errno));
  }

  Worker* findStandby(int slot) const {
    for (const auto& w : workers)
      if (w->standbySlot == slot) return w.get();
    return nullptr;
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
};

}  // namespace drun::agent

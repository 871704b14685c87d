// Starting one worker of a WorkerGroup: its stdout/stderr pipes (or ptys), its stdin, the spawn
// and what a failed exec tells the worker's stderr; and drun's terminal size, which the workers'
// ptys follow.
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>

#include "child_reaper.hpp"
#include "drun/agent/job_guard.hpp"
#include "drun/common/error.hpp"
#include "handler_guard.hpp"
#include "process_spawn.hpp"
#include "pty.hpp"
#include "worker_group_impl.hpp"

namespace drun::agent {

namespace asio = boost::asio;

namespace {

bool hasJobToken(const std::vector<std::string>& env) {
  for (const auto& entry : env)
    if (entry.rfind("DRUN_JOB_TOKEN=", 0) == 0) return true;
  return false;
}
}  // namespace

void WorkerGroup::Impl::resolveTty() {
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

std::optional<winsize> WorkerGroup::Impl::windowSize() const {
  if (auto size = detail::terminalSize(console().fd(ConsoleStream::Out))) return size;
  return detail::terminalSize(console().fd(ConsoleStream::Err));
}

void WorkerGroup::Impl::watchWindowSize() {
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

void WorkerGroup::Impl::forwardStdin(Worker& w, int pipeWrite) {
  auto console = options.output.console ? options.output.console : ConsoleWriter::standard();
  w.stdinForwarder = std::make_unique<detail::StdinForwarder>(io, options.output.stdinFd, pipeWrite,
                                                              [console] { console->lineEndedOutside(); });
}

void WorkerGroup::Impl::startOne(const WorkerSpec& spec, Attach how, int slot) {
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

}  // namespace drun::agent

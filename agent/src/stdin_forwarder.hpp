// StdinForwarder: drun's stdin copied to one worker's stdin pipe (as mpirun gives its stdin to
// rank 0), on the event loop, never blocking it.
//
// Reading: drun's stdin is shared with its shell, so drun never sets O_NONBLOCK on it. A terminal
// or a pipe is reopened through /proc/self/fd (a private open file description, made
// non-blocking) and read when the loop says it is readable; a socket is read with MSG_DONTWAIT;
// a regular file (or /dev/null) is read directly (such reads do not block). A terminal is read
// only while drun is in its foreground process group: in the background (`drun ... &`) a read
// would stop drun (SIGTTIN), so the forwarder looks again every kBackgroundRetry instead (SIGTTIN
// is ignored, so a race gives EIO, handled the same way). If stdin cannot be read without
// blocking (cannot be reopened), the worker gets EOF and a warning says why.
//
// Writing: one chunk at a time to the worker's pipe (ours, non-blocking): the next read waits until
// the worker took the chunk (back-pressure: a worker that does not read stops drun reading).
// EOF on drun's stdin closes the pipe (the worker reads EOF); a worker that closed its stdin or
// died (EPIPE) ends the forwarding: what it did not take is dropped, nothing more is read.
//
// Threading: the io_context's thread only. Ownership: owns the pipe's write end (closed on
// destruction: the worker reads EOF) and the reopened stdin; drun's own fd is never closed.
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>

namespace drun::agent::detail {

class StdinForwarder {
 public:
  static constexpr std::chrono::milliseconds kBackgroundRetry{250};

  // Starts forwarding `sourceFd` (drun's stdin, not owned) to `targetFd` (the write end of the
  // worker's stdin pipe, owned from now on). `onTypedLine` runs (on the loop) after each line read
  // from a terminal: its echo moved the cursor to a new line (ConsoleWriter::lineEndedOutside).
  StdinForwarder(boost::asio::io_context& io, int sourceFd, int targetFd,
                 std::function<void()> onTypedLine = nullptr);
  ~StdinForwarder();
  StdinForwarder(const StdinForwarder&) = delete;
  StdinForwarder& operator=(const StdinForwarder&) = delete;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace drun::agent::detail

// ConsoleWriter: drun's console (its stdout and stderr) written off the event loop, so that a
// reader that stopped reading (a paused pager, a full pipe) slows the workers, never the agent:
// signals and timers always run, and drun can always exit.
//
// Why a writer thread and not Asio's async_write on the console fd: an asynchronous write needs
// O_NONBLOCK, and that flag belongs to the open file description, which drun shares with its
// parent shell and every other process writing to the same terminal or pipe (a dup() shares it
// too). Setting it would make *their* writes fail with EAGAIN. A thread doing ordinary blocking
// write(2)s changes nothing anybody else sees; a reader that never reads costs one parked thread,
// which drain() abandons at exit (the process's exit ends it).
//
// Model: write(stream, bytes) queues whole lines and returns at once. Each destination has a lane:
// a FIFO and one thread writing it in order, one write(2) per batch of whole lines (partial
// writes, EINTR and EAGAIN continued). stdout and stderr share one lane when they are the same
// file (`2>&1`, one terminal): their lines then stay whole and in order relative to each other,
// as when drun wrote them itself. The queue is bounded by back-pressure, not by dropping:
// congested(stream) holds while the lane has more than highWaterBytes queued; producers then stop
// reading their sources (the workers block on their own pipes) and register whenWritable(), called
// once the lane is down to lowWaterBytes. A write error (EPIPE: nobody reads the console any more)
// drops the lane: what was queued and everything written to it later is discarded, and the lane
// is `broken`: whenBroken() callbacks run, so that producers can pass the broken pipe on to the
// workers feeding it (as a shell pipeline would).
//
// Partial lines (a progress bar redrawn with '\r', a prompt waiting for input): a producer that
// sends bytes not ending in '\n' names itself (a LineSource); the lane then holds that line
// "open" for it. Bytes from anybody else first end the open line with "\n", so lines never glue
// together, and when the interrupted source goes on with the rest of its line, the lane puts the
// source's prefix before it (a fresh prefix for the continuation). endLine() ends a source's open
// line and forgets the source.
//
// Threading: every member function may be called from any thread. whenWritable() callbacks run on
// a lane's thread *with the lane's lock held*: they must be short and must not call the writer
// (post to your own event loop). Ownership: the fds are not owned and must stay open until the
// writer is destroyed; destroying it drains for at most ConsoleWriterOptions::drainOnDestroy, then
// abandons what is still queued; it joins each lane's thread (signals blocked: an OwnedThread),
// except one stuck in write(2), which is left to end with that write or with the process.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace drun::agent {

enum class ConsoleStream { Out = 0, Err = 1 };

// A producer whose lines may reach the console in pieces (see the partial-line rules above).
// Identified by address: it must call endLine() before it goes away.
struct LineSource {
  std::string prefix;  // put before the rest of its line when somebody else broke into it
};

struct ConsoleWriterOptions {
  int stdoutFd = 1;
  int stderrFd = 2;
  // Back-pressure bounds, per lane. A producer that checks congested() after each write() keeps a
  // lane within highWaterBytes plus one write per producer.
  size_t highWaterBytes = 1 << 20;
  size_t lowWaterBytes = 256 << 10;
  // How long the destructor waits for the queued bytes to be written.
  std::chrono::milliseconds drainOnDestroy{1000};
};

class ConsoleWriter {
 public:
  explicit ConsoleWriter(ConsoleWriterOptions options = {});
  ~ConsoleWriter();
  ConsoleWriter(const ConsoleWriter&) = delete;
  ConsoleWriter& operator=(const ConsoleWriter&) = delete;

  // drun's own console, fds 1 and 2, created on first use and destroyed at exit (static
  // destruction drains it for at most drainOnDestroy). Sets SIGPIPE to SIG_IGN, like every
  // ConsoleWriter: a closed console pipe must cost drun its console, not its life.
  static std::shared_ptr<ConsoleWriter> standard();

  // Queues `bytes` for `stream`; never blocks. Returns false, discarding them, when the stream's
  // lane was dropped (write error, or abandoned by drain()). Without a `source`, `bytes` are whole
  // lines. With one, they may end inside a line (or after a '\r'): the line stays open for the
  // source until it ends it, or somebody else writes (see above).
  bool write(ConsoleStream stream, std::string bytes, const LineSource* source = nullptr);

  // Ends `source`'s open line on `stream` with "\n" (if it has one) and forgets the source.
  void endLine(ConsoleStream stream, const LineSource* source);

  // The terminal moved to a new line by itself (it echoed a line the user typed): every open line
  // counts as ended, without writing anything, and the rest of each gets its prefix again.
  void lineEndedOutside();

  // True while the stream's lane holds more than highWaterBytes (never for a dropped lane).
  bool congested(ConsoleStream stream) const;

  // Registers `resume`, called once when the stream's lane is down to lowWaterBytes or dropped
  // (see the threading rules above). Returns false and keeps nothing when the lane is not
  // congested any more (resume yourself). `owner` identifies the registration for cancel().
  bool whenWritable(ConsoleStream stream, const void* owner, std::function<void()> resume);

  // Registers `onBroken`, called once when a write to the stream's file fails (EPIPE: its reader
  // went away), under the same rules as whenWritable() callbacks. Returns false and keeps nothing
  // when the lane is broken already.
  bool whenBroken(ConsoleStream stream, const void* owner, std::function<void()> onBroken);

  // Forgets every callback `owner` registered. Once it returns, none of them runs or is running.
  void cancel(const void* owner);

  // True once the stream's lane was dropped (write error or abandoned).
  bool dropped(ConsoleStream stream) const;

  // True once a write to the stream's file failed (its reader went away); not set by drain().
  bool broken(ConsoleStream stream) const;

  // The stream's file descriptor (not owned), e.g. to ask whether it is a terminal.
  int fd(ConsoleStream stream) const;
  // stdout and stderr are one destination (the same terminal, pipe or open file: `2>&1`): one
  // lane writes both, and a worker may give both its streams one pipe to keep their order.
  bool sharedDestination() const { return lanes_[0] == lanes_[1]; }

  // Blocks until everything queued so far is written (or discarded by a write error), or
  // `timeout`; returns whether it was. Changes nothing on a timeout: what is queued stays queued.
  bool flush(std::chrono::milliseconds timeout);

  // flush(), and when the deadline passes, the lanes still busy are abandoned (dropped: nothing
  // more is written to them, not even the rest of a line; a write(2) in progress is left to the
  // reader or to the process's exit). What drun does at exit: it prints nothing more, it exits.
  bool drain(std::chrono::milliseconds timeout);

 private:
  struct Lane;
  Lane& lane(ConsoleStream stream) const;
  bool waitWritten(std::chrono::milliseconds timeout, bool abandon);

  ConsoleWriterOptions options_;
  std::shared_ptr<Lane> lanes_[2];  // [Out], [Err]; the same lane twice when they share a file
};

}  // namespace drun::agent

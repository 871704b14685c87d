// OutputMux: reading the workers' pipes, and back-pressure (output_mux.hpp): a pipe whose console
// or log files are congested waits, and what a paused pipe holds can be swept at once.
#include <poll.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <boost/asio/buffer.hpp>
#include <boost/asio/post.hpp>
#include <cerrno>

#include "handler_guard.hpp"
#include "output_mux_impl.hpp"

namespace drun::agent {

namespace asio = boost::asio;

namespace {

constexpr size_t kReadChunkBytes = 64 * 1024;
// A sweep reads at most this much from one pipe (a descendant may still be writing to it).
constexpr size_t kMaxSweepBytes = 1 << 20;

}  // namespace

void OutputMux::Impl::startReading(Stream& stream, int fd) {
  stream.buffer.resize(kReadChunkBytes);
  stream.partialTimer.emplace(io);
  stream.pipe.emplace(io, fd);
  read(stream);
}

void OutputMux::Impl::read(Stream& stream) {
  stream.pipe->async_read_some(
      asio::buffer(stream.buffer), [this, &stream, life = std::weak_ptr<int>(life)](
                                       const boost::system::error_code& ec, size_t n) {
        if (life.expired()) return;
        detail::guarded("worker output", [&] {
          if (n > 0) consume(stream, stream.buffer.data(), n);  // lost if it throws (memory)
        });
        detail::guarded("worker output", [&] {
          if (ec) return finish(stream);  // EOF or a read error: this pipe is done
          continueReading(stream);
        });
      });
}

void OutputMux::Impl::continueReading(Stream& stream) {
  if (stream.file && files->congested()) return pauseForFiles(stream);
  ConsoleStream target = stream.target();
  if (!stream.toConsole || !console->congested(target)) return read(stream);
  stream.paused = true;
  if (waitingForConsole[static_cast<int>(target)]) return;
  auto resume = [this, target, executor = io.get_executor(), life = std::weak_ptr<int>(life)] {
    // On the console's thread, its lock held: only post.
    asio::post(executor, [this, target, life] {
      if (!life.expired()) detail::guarded("worker output", [&] { resumeReading(target); });
    });
  };
  waitingForConsole[static_cast<int>(target)] = true;
  if (!console->whenWritable(target, this, std::move(resume))) resumeReading(target);
}

void OutputMux::Impl::pauseForFiles(Stream& stream) {
  stream.paused = true;
  if (waitingForFiles) return;
  auto resume = [this, executor = io.get_executor(), life = std::weak_ptr<int>(life)] {
    // On the log writer's thread, its lock held: only post.
    asio::post(executor, [this, life] {
      if (!life.expired()) detail::guarded("worker output", [&] { resumeAfterFiles(); });
    });
  };
  waitingForFiles = true;
  if (!files->whenWritable(this, std::move(resume))) resumeAfterFiles();
}

void OutputMux::Impl::resumeAfterFiles() {
  waitingForFiles = false;
  for (Source* src : allSources())
    for (Stream* stream : {&src->out, &src->err})
      if (stream->paused && stream->file && !stream->eof) {
        stream->paused = false;
        continueReading(*stream);  // may pause again, for the console or the files
      }
}

bool OutputMux::Impl::sweep(Stream& stream) {
  if (!stream.paused || stream.eof || !stream.pipe || !stream.pipe->is_open()) return false;
  int fd = stream.pipe->native_handle();
  for (size_t swept = 0; swept < kMaxSweepBytes;) {
    pollfd ready{fd, POLLIN, 0};
    if (::poll(&ready, 1, 0) <= 0) return false;  // nothing now (an error: the read will say)
    ssize_t n = ::read(fd, stream.buffer.data(), stream.buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n == 0;
    consume(stream, stream.buffer.data(), static_cast<size_t>(n));
    swept += static_cast<size_t>(n);
  }
  return false;
}

void OutputMux::Impl::sweepRank(int localRank) {
  auto it = sources.find(localRank);
  if (it == sources.end()) return;
  for (Stream* stream : {&it->second->out, &it->second->err})
    if (sweep(*stream)) {
      stream->paused = false;
      read(*stream);  // completes at once with EOF and finishes the stream
    }
}

void OutputMux::Impl::resumeReading(ConsoleStream target) {
  waitingForConsole[static_cast<int>(target)] = false;
  for (Source* src : allSources())
    for (Stream* stream : {&src->out, &src->err})
      if (stream->paused && stream->target() == target) {
        stream->paused = false;
        read(*stream);
      }
}

void OutputMux::Impl::consoleBroken(ConsoleStream target) {
  std::weak_ptr<int> alive = life;
  std::vector<Stream*> affected;
  for (Source* src : allSources())
    for (Stream* stream : {&src->out, &src->err})
      if (stream->toConsole && stream->target() == target && !stream->eof && stream->pipe)
        affected.push_back(stream);
  if (!affected.empty())
    spdlog::debug("worker output: console {} broken: closing {} worker stream(s)",
                  target == ConsoleStream::Err ? "stderr" : "stdout", affected.size());
  for (Stream* stream : affected) {
    boost::system::error_code ignored;
    stream->pipe->close(ignored);  // a read in flight completes (aborted) and finishes it
    if (stream->paused) {
      stream->paused = false;
      finish(*stream);  // may destroy the mux
      if (alive.expired()) return;
    }
  }
}

}  // namespace drun::agent

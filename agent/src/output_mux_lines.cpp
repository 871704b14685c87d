// OutputMux: the bytes read from a worker's pipe go to its log file as they are and to the
// console as prefixed lines (output_mux.hpp); a partial line waits for its end or for the
// partial-line timer, and EOF flushes what is left.
#include <sys/ioctl.h>
#include <spdlog/spdlog.h>

#include <string_view>

#include "handler_guard.hpp"
#include "output_mux_impl.hpp"

namespace drun::agent {

detail::SegmentSink OutputMux::Impl::sinkOf(Stream& stream) {
  return {batch, stream.line.prefix, stream.toConsole, stream.tailInto,
          options.stderrTailLines, kMaxTailLineBytes};
}

void OutputMux::Impl::flushBatch(Stream& stream) {
  if (batch.empty()) return;
  ConsoleStream target = stream.target();
  if (!console->write(target, std::move(batch), &stream.line) &&
      !consoleDropped[static_cast<int>(target)]) {
    // EPIPE (nobody reads drun's output) or abandoned at exit.
    consoleDropped[static_cast<int>(target)] = true;
    spdlog::debug("worker output: console {} dropped",
                  target == ConsoleStream::Err ? "stderr" : "stdout");
  }
  batch.clear();
}

void OutputMux::Impl::armPartialTimer(Stream& stream, std::chrono::steady_clock::duration after) {
  if (stream.timerArmed || !stream.toConsole) return;
  stream.timerArmed = true;
  stream.partialTimer->expires_after(after);
  stream.partialTimer->async_wait(
      [this, &stream, life = std::weak_ptr<int>(life)](const boost::system::error_code& ec) {
        if (life.expired()) return;
        stream.timerArmed = false;
        // Paused by back-pressure: the stream is not quiet, we are; the next read arms again.
        if (ec || !stream.text.holdsPartial() || stream.paused || stream.eof) return;
        detail::guarded("worker output", [&] {
          auto idle = std::chrono::steady_clock::now() - stream.lastBytes;
          Stream& sibling = &stream == &stream.source->out ? stream.source->err : stream.source->out;
          if (holdsBytes(stream) || holdsBytes(sibling))
            return armPartialTimer(stream, delayOf(stream));
          if (idle < delayOf(stream)) return armPartialTimer(stream, delayOf(stream) - idle);
          stream.text.flushPartial('\0', sinkOf(stream));
          flushBatch(stream);
        });
      });
}

bool OutputMux::Impl::holdsBytes(Stream& stream) {
  if (stream.paused) return true;
  if (stream.eof || !stream.pipe || !stream.pipe->is_open()) return false;
  int pending = 0;
  return ::ioctl(stream.pipe->native_handle(), FIONREAD, &pending) == 0 && pending > 0;
}

void OutputMux::Impl::writeFile(Stream& stream, const char* data, size_t size) {
  if (!stream.file) return;
  files->write(stream.file, std::string_view(data, size));
  for (const std::string& failure : files->takeFailures())
    spdlog::warn("worker output: writing a log file failed: {}", failure);
}

void OutputMux::Impl::consume(Stream& stream, const char* data, size_t size) {
  writeFile(stream, data, size);
  stream.filtered.consume(std::string_view(data, size), stream.source->prefix, *files);
  stream.text.consume(std::string_view(data, size), kMaxLineBytes, sinkOf(stream));
  flushBatch(stream);
  if (stream.text.holdsPartial()) {
    stream.lastBytes = std::chrono::steady_clock::now();
    armPartialTimer(stream, delayOf(stream));
  }
}

void OutputMux::Impl::finish(Stream& stream) {
  if (stream.eof) return;
  stream.eof = true;
  stream.filtered.finish(stream.source->prefix, *files);
  stream.text.flushPartial('\n', sinkOf(stream));  // the newline the worker did not write
  stream.text.flushReturns(sinkOf(stream));
  flushBatch(stream);
  console->endLine(stream.target(), &stream.line);  // a flushed piece or a '\r' left open
  if (stream.partialTimer) stream.partialTimer->cancel();
  boost::system::error_code ignored;
  stream.pipe->close(ignored);
  Source& src = *stream.source;
  if (src.out.eof && src.err.eof && src.onClosed) {
    auto onClosed = std::move(src.onClosed);
    src.onClosed = nullptr;
    onClosed();  // may destroy the mux: nothing after this
  }
}

}  // namespace drun::agent

#include "drun/agent/output_mux.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <system_error>
#include <utility>

#include "drun/common/error.hpp"
#include "fd_write.hpp"
#include "handler_guard.hpp"
#include "line_segments.hpp"
#include "filtered_lines.hpp"
#include "log_file_writer.hpp"

namespace drun::agent {

namespace asio = boost::asio;

namespace {

constexpr size_t kReadChunkBytes = 64 * 1024;
// A sweep reads at most this much from one pipe (a descendant may still be writing to it).
constexpr size_t kMaxSweepBytes = 1 << 20;

void replaceAll(std::string& text, std::string_view macro, const std::string& value) {
  for (size_t at = text.find(macro); at != std::string::npos; at = text.find(macro, at)) {
    text.replace(at, macro.size(), value);
    at += value.size();
  }
}

}  // namespace

std::string expandPrefix(const std::string& tmpl, const OutputOptions& options, int localRank,
                         int globalRank) {
  std::string out = tmpl;
  if (out.find("${") == std::string::npos) return out;
  replaceAll(out, "${rank}", std::to_string(globalRank));
  replaceAll(out, "${local_rank}", std::to_string(localRank));
  replaceAll(out, "${role_name}", options.roleName);
  replaceAll(out, "${hostname}", options.hostname);
  return out;
}

struct OutputMux::Impl {
  struct Source;

  // One pipe (a worker's stdout or stderr) and where its bytes go.
  struct Stream {
    Source* source = nullptr;
    bool isStderr = false;
    std::deque<std::string>* tailInto = nullptr;  // its last lines, for the failure summary
    std::optional<asio::posix::stream_descriptor> pipe;
    std::vector<char> buffer;
    detail::LineSegments text;  // the segments and tail lines its bytes make
    LineSource line;            // this stream's identity and prefix for the console
    std::optional<asio::steady_timer> partialTimer;
    bool timerArmed = false;
    std::chrono::steady_clock::time_point lastBytes;  // the last read that left a partial line
    std::shared_ptr<detail::LogFileWriter::File> file;  // raw bytes, as the worker wrote them
    detail::FilteredLines filtered;                      // --duplicate-*-filters' lines
    bool toConsole = true;
    bool eof = false;
    bool paused = false;  // waiting for the console to drain (back-pressure)
    ConsoleStream target() const { return isStderr ? ConsoleStream::Err : ConsoleStream::Out; }
  };

  struct Source {
    int localRank = 0;
    int globalRank = 0;
    std::string prefix;
    Stream out;
    Stream err;
    std::deque<std::string> tail;     // stderr's last lines (both streams' when merged)
    std::deque<std::string> outTail;  // stdout's, for a summary when stderr said nothing
    std::function<void()> onClosed;
    bool attached = false;
  };

  Impl(asio::io_context& io, OutputOptions options)
      : io(io),
        options(std::move(options)),
        console(this->options.console ? this->options.console : ConsoleWriter::standard()) {
    for (ConsoleStream target : {ConsoleStream::Out, ConsoleStream::Err}) {
      partialLineDelay[static_cast<int>(target)] = ::isatty(console->fd(target)) == 1
                                                       ? this->options.partialLineDelay
                                                       : this->options.partialLinePipeDelay;
      auto broken = [this, target, executor = io.get_executor(), life = std::weak_ptr<int>(life)] {
        // On the console's thread, its lock held: only post.
        asio::post(executor, [this, target, life] {
          if (!life.expired()) detail::guarded("worker output", [&] { consoleBroken(target); });
        });
      };
      if (!console->whenBroken(target, this, broken)) broken();
    }
  }

  ~Impl() {
    // What the workers left in pipes paused by back-pressure still goes to the files and the
    // console queue, which outlives the mux and drains at exit.
    detail::guarded("worker output", [&] {
      for (Source* src : allSources())
        for (Stream* stream : {&src->out, &src->err}) {
          sweep(*stream);
          if (!stream->eof && stream->text.holdsPartial()) {
            stream->text.flushPartial('\n', sinkOf(*stream));
            flushBatch(*stream);
          }
          console->endLine(stream->target(), &stream->line);  // the source goes away
        }
    });
    console->cancel(this);  // no resume callback runs once this returns
    files->cancel(this);
  }

  asio::io_context& io;
  OutputOptions options;
  std::shared_ptr<ConsoleWriter> console;
  // Per console stream: OutputOptions::partialLineDelay on a terminal, partialLinePipeDelay else.
  std::chrono::milliseconds partialLineDelay[2];
  bool consoleDropped[2] = {false, false};     // by ConsoleStream, as last seen (logged once)
  bool waitingForConsole[2] = {false, false};  // a whenWritable() registration is pending
  std::shared_ptr<detail::LogFileWriter> files = detail::LogFileWriter::standard();
  bool waitingForFiles = false;  // a files->whenWritable() registration is pending
  std::shared_ptr<detail::LogFileWriter::File> filteredFiles[2];  // by isStderr, opened once
  std::map<int, std::unique_ptr<Source>> sources;
  // Sources of replaced workers (reattach()): their pipes may still be read to their end.
  std::vector<std::unique_ptr<Source>> retired;
  std::string batch;  // whole lines of one read, handed to the console at once
  std::shared_ptr<int> life = std::make_shared<int>(0);

  bool consoleAllowed(int localRank) const {
    if (!options.consoleLocalRanks) return true;
    const auto& ranks = *options.consoleLocalRanks;
    return std::find(ranks.begin(), ranks.end(), localRank) != ranks.end();
  }

  // Every source, a replaced worker's too.
  std::vector<Source*> allSources() {
    std::vector<Source*> out;
    for (auto& [rank, src] : sources) out.push_back(src.get());
    for (auto& src : retired) out.push_back(src.get());
    return out;
  }

  // `continuing`: the source of the worker this one replaces, whose log files go on.
  Source& prepare(int localRank, int globalRank, const Source* continuing = nullptr) {
    if (auto it = sources.find(localRank); it != sources.end()) return *it->second;
    auto src = std::make_unique<Source>();
    src->out.source = src->err.source = src.get();
    src->err.isStderr = true;
    src->err.tailInto = &src->tail;
    src->out.tailInto = &src->outTail;
    label(*src, localRank, globalRank, continuing);
    // Entered only now: a rank whose files could not be opened leaves no empty entry behind.
    return *sources.emplace(localRank, std::move(src)).first->second;
  }

  // The rank's prefix, routing and log files (a continuing source's files go on).
  void label(Source& src, int localRank, int globalRank, const Source* continuing) {
    src.localRank = localRank;
    src.globalRank = globalRank;
    src.prefix = expandPrefix(options.prefixTemplate, options, localRank, globalRank);
    src.out.line.prefix = src.err.line.prefix = src.prefix;
    StdRouting routing = options.defaultRouting;
    if (auto it = options.routing.find(localRank); it != options.routing.end())
      routing = it->second;
    bool console = consoleAllowed(localRank);
    src.out.toConsole = console;
    src.err.toConsole = console;
    if (options.attemptDir) {
      std::filesystem::path dir = *options.attemptDir / std::to_string(localRank);
      std::error_code ec;
      std::filesystem::create_directories(dir, ec);
      if (ec)
        throw Error("cannot create worker log directory " + dir.string() + ": " + ec.message());
      src.out.file = continuing ? continuing->out.file : files->open(dir / "stdout.log", options.logRotation);
      src.err.file = continuing ? continuing->err.file : files->open(dir / "stderr.log", options.logRotation);
      for (Stream* stream : {&src.out, &src.err}) addFilters(*stream);
      // A redirected stream stays off the console unless it is also tee'd (torchrun: tee wins).
      src.out.toConsole = console && (!(routing.redirect & 1) || (routing.tee & 1));
      src.err.toConsole = console && (!(routing.redirect & 2) || (routing.tee & 2));
    }
  }

  // --duplicate-*-filters: the attempt's filtered_stdout.log / filtered_stderr.log (torchrun's
  // names), shared by every rank.
  void addFilters(Stream& stream) {
    const auto& substrings = stream.isStderr ? options.duplicateStderrFilters : options.duplicateStdoutFilters;
    if (substrings.empty()) return;
    auto& file = filteredFiles[stream.isStderr];
    if (!file) file = files->open(*options.attemptDir / (stream.isStderr ? "filtered_stderr.log" : "filtered_stdout.log"), options.logRotation);
    stream.filtered.addTarget(substrings, file);
  }

  // A standby's source: no log files; the console when no rank is filtered off it, prefixed as
  // the template would prefix a rank named "standby <slot>".
  Source& prepareStandby(int slot) {
    auto src = std::make_unique<Source>();
    src->out.source = src->err.source = src.get();
    src->err.isStderr = true;
    src->err.tailInto = &src->tail;
    src->out.tailInto = &src->outTail;
    src->localRank = src->globalRank = standbySource(slot);
    src->prefix = options.prefixTemplate;
    for (const char* macro : {"${rank}", "${local_rank}"})
      replaceAll(src->prefix, macro, "standby " + std::to_string(slot));
    src->prefix = expandPrefix(src->prefix, options, 0, 0);
    src->out.line.prefix = src->err.line.prefix = src->prefix;
    src->out.toConsole = src->err.toConsole = !options.consoleLocalRanks;
    return *sources.emplace(standbySource(slot), std::move(src)).first->second;
  }

  // Starts reading a source's pipes; stderrFd -1: both streams come through stdoutFd.
  void startSource(Source& src, int stdoutFd, int stderrFd, std::function<void()> onClosed) {
    if (src.attached) throw std::logic_error("OutputMux: local rank attached twice");
    src.attached = true;
    src.onClosed = std::move(onClosed);
    startReading(src.out, stdoutFd);
    if (stderrFd >= 0) {
      startReading(src.err, stderrFd);
    } else {
      src.err.eof = true;  // merged into stdout's pipe
      src.out.tailInto = &src.tail;
      src.out.filtered.addTargets(src.err.filtered);
    }
  }

  // The rank's source moves to `retired` (its pipes are read to their end); returns it, or null.
  const Source* retire(int localRank) {
    auto it = sources.find(localRank);
    if (it == sources.end()) return nullptr;
    retired.push_back(std::move(it->second));
    sources.erase(it);
    return retired.back().get();
  }

  void startReading(Stream& stream, int fd) {
    stream.buffer.resize(kReadChunkBytes);
    stream.partialTimer.emplace(io);
    stream.pipe.emplace(io, fd);
    read(stream);
  }

  void read(Stream& stream) {
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

  // The next read, unless the console this stream feeds is congested: then the pipe waits (its
  // worker blocks once the pipe is full) until the console is down to its low-water mark.
  void continueReading(Stream& stream) {
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

  // The log files' queue is full (a slow file system): streams feeding files wait for it.
  void pauseForFiles(Stream& stream) {
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

  void resumeAfterFiles() {
    waitingForFiles = false;
    for (Source* src : allSources())
      for (Stream* stream : {&src->out, &src->err})
        if (stream->paused && stream->file && !stream->eof) {
          stream->paused = false;
          continueReading(*stream);  // may pause again, for the console or the files
        }
  }

  // Reads what a pipe paused by back-pressure holds now, without waiting (bounded by
  // kMaxSweepBytes). Returns true when it reached EOF; the stream is not finished (that is the
  // asynchronous read's job, so that onClosed never runs from in here). A stream that is not
  // paused is left alone: its read is in flight, or done and queued on the loop with bytes in
  // `buffer`, and reading past it would reorder its lines.
  bool sweep(Stream& stream) {
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

  void sweepRank(int localRank) {
    auto it = sources.find(localRank);
    if (it == sources.end()) return;
    for (Stream* stream : {&it->second->out, &it->second->err})
      if (sweep(*stream)) {
        stream->paused = false;
        read(*stream);  // completes at once with EOF and finishes the stream
      }
  }

  void resumeReading(ConsoleStream target) {
    waitingForConsole[static_cast<int>(target)] = false;
    for (Source* src : allSources())
      for (Stream* stream : {&src->out, &src->err})
        if (stream->paused && stream->target() == target) {
          stream->paused = false;
          read(*stream);
        }
  }

  // Where the stream's segments go: the batch (sent by flushBatch) and its tail.
  detail::SegmentSink sinkOf(Stream& stream) {
    return {batch, stream.line.prefix, stream.toConsole, stream.tailInto,
            options.stderrTailLines, kMaxTailLineBytes};
  }

  void flushBatch(Stream& stream) {
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

  std::chrono::milliseconds delayOf(const Stream& stream) const {
    return partialLineDelay[static_cast<int>(stream.target())];
  }

  // A partial line (a progress bar, a prompt) goes out as it is once its worker was quiet for
  // delayOf(stream): no byte arrived meanwhile and none waits in either of its
  // pipes (a long line still arriving, one the loop has not read yet, or a worker blocked on its
  // other stream is not cut). One-shot, armed only when a read leaves a partial line: whole-line
  // output never wakes the loop.
  void armPartialTimer(Stream& stream, std::chrono::steady_clock::duration after) {
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

  // Bytes wait in the stream's pipe, or would if we read it (paused by back-pressure).
  static bool holdsBytes(Stream& stream) {
    if (stream.paused) return true;
    if (stream.eof || !stream.pipe || !stream.pipe->is_open()) return false;
    int pending = 0;
    return ::ioctl(stream.pipe->native_handle(), FIONREAD, &pending) == 0 && pending > 0;
  }

  // The console's reader went away (EPIPE): as in a shell pipeline, the workers writing to it
  // must see a broken pipe on their next write, so their pipes (pty masters) are closed.
  void consoleBroken(ConsoleStream target) {
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

  // Queued for the log writer's thread (a stalled file system never blocks the loop).
  void writeFile(Stream& stream, const char* data, size_t size) {
    if (!stream.file) return;
    files->write(stream.file, std::string_view(data, size));
    for (const std::string& failure : files->takeFailures())
      spdlog::warn("worker output: writing a log file failed: {}", failure);
  }

  // The bytes go to the log file as they are, and as segments to the console now; a partial
  // line waits for more bytes or for the partial-line timer.
  void consume(Stream& stream, const char* data, size_t size) {
    writeFile(stream, data, size);
    stream.filtered.consume(std::string_view(data, size), stream.source->prefix, *files);
    stream.text.consume(std::string_view(data, size), kMaxLineBytes, sinkOf(stream));
    flushBatch(stream);
    if (stream.text.holdsPartial()) {
      stream.lastBytes = std::chrono::steady_clock::now();
      armPartialTimer(stream, delayOf(stream));
    }
  }

  void finish(Stream& stream) {
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
};
OutputMux::OutputMux(asio::io_context& io, OutputOptions options)
    : impl_(std::make_unique<Impl>(io, std::move(options))) {}

OutputMux::~OutputMux() = default;

void OutputMux::prepare(int localRank, int globalRank) { impl_->prepare(localRank, globalRank); }

void OutputMux::attach(int localRank, int globalRank, int stdoutFd, int stderrFd,
                       std::function<void()> onClosed) {
  impl_->startSource(impl_->prepare(localRank, globalRank), stdoutFd, stderrFd, std::move(onClosed));
}

void OutputMux::reattach(int localRank, int globalRank, int stdoutFd, int stderrFd,
                         std::function<void()> onClosed) {
  const Impl::Source* previous = impl_->retire(localRank);
  impl_->startSource(impl_->prepare(localRank, globalRank, previous), stdoutFd, stderrFd, std::move(onClosed));
}

void OutputMux::attachStandby(int slot, int stdoutFd, int stderrFd, std::function<void()> onClosed) {
  if (impl_->sources.count(standbySource(slot))) throw std::logic_error("OutputMux: standby slot attached twice");
  impl_->startSource(impl_->prepareStandby(slot), stdoutFd, stderrFd, std::move(onClosed));
}

void OutputMux::adopt(int slot, int localRank, int globalRank) {
  auto it = impl_->sources.find(standbySource(slot));
  if (it == impl_->sources.end()) throw std::logic_error("OutputMux::adopt: no standby in that slot");
  std::unique_ptr<Impl::Source> src = std::move(it->second);
  impl_->sources.erase(it);
  const Impl::Source* previous = impl_->retire(localRank);
  impl_->label(*src, localRank, globalRank, previous);
  impl_->sources.emplace(localRank, std::move(src));
}

void OutputMux::sweep(int localRank) { impl_->sweepRank(localRank); }

bool OutputMux::closed(int localRank) const {
  auto it = impl_->sources.find(localRank);
  return it != impl_->sources.end() && it->second->out.eof && it->second->err.eof;
}

std::deque<std::string> OutputMux::stderrTail(int localRank) const {
  auto it = impl_->sources.find(localRank);
  if (it == impl_->sources.end()) return {};
  return it->second->tail;
}

std::deque<std::string> OutputMux::stdoutTail(int localRank) const {
  auto it = impl_->sources.find(localRank);
  if (it == impl_->sources.end()) return {};
  return it->second->outTail;
}

}  // namespace drun::agent

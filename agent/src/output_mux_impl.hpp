// OutputMux::Impl: the sources (one per rank, standby or replaced worker) and their streams.
// output_mux.cpp holds the sources (prefix, routing, log files) and the public API;
// output_mux_reading.cpp reads the pipes and applies back-pressure; output_mux_lines.cpp turns
// the bytes read into log-file writes and console lines (the partial-line timer, EOF).
//
// Threading: everything on the io_context's thread; handlers hold `life` weakly, so none runs
// once the Impl is gone.
#pragma once

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "drun/agent/output_mux.hpp"
#include "filtered_lines.hpp"
#include "line_segments.hpp"
#include "log_file_writer.hpp"

namespace drun::agent {

struct OutputMux::Impl {
  struct Source;

  // One pipe (a worker's stdout or stderr) and where its bytes go.
  struct Stream {
    Source* source = nullptr;
    bool isStderr = false;
    std::deque<std::string>* tailInto = nullptr;  // its last lines, for the failure summary
    std::optional<boost::asio::posix::stream_descriptor> pipe;
    std::vector<char> buffer;
    detail::LineSegments text;  // the segments and tail lines its bytes make
    LineSource line;            // this stream's identity and prefix for the console
    std::optional<boost::asio::steady_timer> partialTimer;
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

  Impl(boost::asio::io_context& io, OutputOptions options);
  ~Impl();

  boost::asio::io_context& io;
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

  // Sources: a rank's prefix, routing and log files (output_mux.cpp).
  // `continuing`: the source of the worker this one replaces, whose log files go on.
  Source& prepare(int localRank, int globalRank, const Source* continuing = nullptr);
  // The rank's prefix, routing and log files (a continuing source's files go on).
  void label(Source& src, int localRank, int globalRank, const Source* continuing);
  // --duplicate-*-filters: the attempt's filtered_stdout.log / filtered_stderr.log (torchrun's
  // names), shared by every rank.
  void addFilters(Stream& stream);
  // A standby's source: no log files; the console when no rank is filtered off it, prefixed as
  // the template would prefix a rank named "standby <slot>".
  Source& prepareStandby(int slot);
  // Starts reading a source's pipes; stderrFd -1: both streams come through stdoutFd.
  void startSource(Source& src, int stdoutFd, int stderrFd, std::function<void()> onClosed);
  // The rank's source moves to `retired` (its pipes are read to their end); returns it, or null.
  const Source* retire(int localRank);

  // Reading the pipes, and back-pressure (output_mux_reading.cpp).
  void startReading(Stream& stream, int fd);
  void read(Stream& stream);
  // The next read, unless the console this stream feeds is congested: then the pipe waits (its
  // worker blocks once the pipe is full) until the console is down to its low-water mark.
  void continueReading(Stream& stream);
  // The log files' queue is full (a slow file system): streams feeding files wait for it.
  void pauseForFiles(Stream& stream);
  void resumeAfterFiles();
  void resumeReading(ConsoleStream target);
  // Reads what a pipe paused by back-pressure holds now, without waiting (bounded by
  // kMaxSweepBytes). Returns true when it reached EOF; the stream is not finished (that is the
  // asynchronous read's job, so that onClosed never runs from in here). A stream that is not
  // paused is left alone: its read is in flight, or done and queued on the loop with bytes in
  // `buffer`, and reading past it would reorder its lines.
  bool sweep(Stream& stream);
  void sweepRank(int localRank);
  // The console's reader went away (EPIPE): as in a shell pipeline, the workers writing to it
  // must see a broken pipe on their next write, so their pipes (pty masters) are closed.
  void consoleBroken(ConsoleStream target);

  // Bytes to lines, log files and the console (output_mux_lines.cpp).
  // The bytes go to the log file as they are, and as segments to the console now; a partial
  // line waits for more bytes or for the partial-line timer.
  void consume(Stream& stream, const char* data, size_t size);
  // Queued for the log writer's thread (a stalled file system never blocks the loop).
  void writeFile(Stream& stream, const char* data, size_t size);
  // Where the stream's segments go: the batch (sent by flushBatch) and its tail.
  detail::SegmentSink sinkOf(Stream& stream);
  void flushBatch(Stream& stream);
  // A partial line (a progress bar, a prompt) goes out as it is once its worker was quiet for
  // delayOf(stream): no byte arrived meanwhile and none waits in either of its
  // pipes (a long line still arriving, one the loop has not read yet, or a worker blocked on its
  // other stream is not cut). One-shot, armed only when a read leaves a partial line: whole-line
  // output never wakes the loop.
  void armPartialTimer(Stream& stream, std::chrono::steady_clock::duration after);
  // Bytes wait in the stream's pipe, or would if we read it (paused by back-pressure).
  static bool holdsBytes(Stream& stream);
  // EOF or a read error: the stream's last bytes go out, and the source's onClosed runs once
  // both its streams are done (it may destroy the mux).
  void finish(Stream& stream);

  std::chrono::milliseconds delayOf(const Stream& stream) const {
    return partialLineDelay[static_cast<int>(stream.target())];
  }
};

}  // namespace drun::agent

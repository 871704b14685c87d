#pragma once
// How one worker stream's bytes become console segments and tail lines (OutputMux's per-stream
// text state, apart from its pipes, timers and back-pressure).

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>

namespace drun::agent::detail {

// Where a stream's segments go: console bytes appended to `batch` (prefixed) when `toConsole`,
// and whole lines into `tail` (at most `tailLines`, each at most `tailLineBytes`) when it is set.
struct SegmentSink {
  std::string& batch;
  const std::string& prefix;
  bool toConsole = true;
  std::deque<std::string>* tail = nullptr;
  size_t tailLines = 0;
  size_t tailLineBytes = 0;
};

class LineSegments {
 public:
  // Cuts `bytes` into segments ending in '\n' or '\r': they go to the sink now; the rest waits
  // in partial() for more bytes (or for flushPartial). A line longer than `maxLineBytes` goes
  // out in pieces of an open line.
  void consume(std::string_view bytes, size_t maxLineBytes, const SegmentSink& sink);
  // The held partial line goes out, ended by `end`: '\0' (a piece of a line still open: the
  // partial-line timer) or '\n' (the stream ended without one). Nothing when none is held.
  void flushPartial(char end, const SegmentSink& sink);
  // The lone '\r's held for the next segment's front: the stream ended, they go out as they are.
  void flushReturns(const SegmentSink& sink);
  bool holdsPartial() const { return !partial_.empty(); }

 private:
  void emit(std::string_view text, char end, const SegmentSink& sink);
  void addToTail(std::string_view text, char end, const SegmentSink& sink);

  std::string partial_;          // the segment being assembled across reads, not sent yet
  bool segmentOpen_ = false;     // the prefix and part of the current segment were sent
  bool afterReturn_ = false;     // the last segment sent ended with '\r'
  size_t pendingReturns_ = 0;    // lone '\r's at a segment's start, sent before its prefix
  std::string tailLine_;         // the tail's line being assembled
  bool tailRedrawn_ = false;     // a '\r' ended it: new text replaces it
};

}  // namespace drun::agent::detail

#include "line_segments.hpp"

#include <algorithm>
#include <utility>

namespace drun::agent::detail {

void LineSegments::consume(std::string_view bytes, size_t maxLineBytes, const SegmentSink& sink) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t found = bytes.find_first_of("\n\r", pos);
    size_t lineEnd = found == std::string_view::npos ? bytes.size() : found;
    size_t take = std::min(lineEnd - pos, maxLineBytes - partial_.size());
    bool complete = found != std::string_view::npos && take == lineEnd - pos;
    if (complete && partial_.empty()) {
      emit(bytes.substr(pos, take), bytes[lineEnd], sink);
    } else {
      partial_.append(bytes.substr(pos, take));
      if (complete || partial_.size() >= maxLineBytes) {
        // Longer than maxLineBytes: this piece goes out as an open line, the rest follows on it
        // unprefixed (on a fresh prefixed line only if another line came in between).
        emit(partial_, complete ? bytes[lineEnd] : '\0', sink);
        partial_.clear();
      }
    }
    pos += take + (complete ? 1 : 0);
  }
}

void LineSegments::flushPartial(char end, const SegmentSink& sink) {
  if (partial_.empty()) return;
  emit(partial_, end, sink);
  partial_.clear();
}

void LineSegments::flushReturns(const SegmentSink& sink) {
  if (sink.toConsole) sink.batch.append(std::exchange(pendingReturns_, 0), '\r');
}

// One segment of a line: `text` then `end`, which is '\n', '\r' (a redraw: the console gets it
// too, so a progress bar redraws in place, each redraw prefixed) or '\0' (a piece of a line
// that is still open: the partial-line timer flushed it, the rest comes later, unprefixed).
void LineSegments::emit(std::string_view text, char end, const SegmentSink& sink) {
  // "\r\n" (or a lone '\r' before the line end): the '\n' ends the segment the '\r' ended.
  const bool lineEndAfterReturn = end == '\n' && text.empty() && afterReturn_;
  // An empty piece at the start of a segment: nothing to send.
  const bool nothing = text.empty() && !segmentOpen_ && end == '\0';
  // A lone '\r' at the start of a segment (tqdm's "\r" before each bar) is kept, in front of
  // the next segment's prefix: no empty prefixed segment, and with --prefix '' the console
  // gets the worker's bytes exactly.
  const bool loneReturn = text.empty() && !segmentOpen_ && end == '\r';
  if (loneReturn) {
    ++pendingReturns_;
  } else if (sink.toConsole && !nothing) {
    sink.batch.append(std::exchange(pendingReturns_, 0), '\r');
    if (!segmentOpen_ && !lineEndAfterReturn) sink.batch += sink.prefix;
    sink.batch += text;
    if (end) sink.batch += end;
  }
  if (!nothing && !loneReturn) {
    segmentOpen_ = end == '\0';
    afterReturn_ = end == '\r';
  }
  if (sink.tail && sink.tailLines > 0) addToTail(text, end, sink);
}

// The tail holds lines as a terminal would show them: the last redraw of a '\r' line.
void LineSegments::addToTail(std::string_view text, char end, const SegmentSink& sink) {
  if (tailRedrawn_ && !text.empty()) {
    tailLine_.clear();
    tailRedrawn_ = false;
  }
  tailLine_.append(text.substr(0, sink.tailLineBytes - std::min(sink.tailLineBytes, tailLine_.size())));
  if (end == '\r') tailRedrawn_ = true;
  if (end != '\n') return;
  auto& tail = *sink.tail;
  tail.push_back(std::move(tailLine_));
  tailLine_.clear();
  tailRedrawn_ = false;
  while (tail.size() > sink.tailLines) tail.pop_front();
}

}  // namespace drun::agent::detail

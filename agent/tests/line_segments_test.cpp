#include "line_segments.hpp"

#include <catch2/catch.hpp>

using drun::agent::detail::LineSegments;
using drun::agent::detail::SegmentSink;

namespace {

struct Segmented {
  std::string batch;
  std::string prefix = "[0]:";
  std::deque<std::string> tail;
  LineSegments text;
  SegmentSink sink(size_t tailLines = 3) { return {batch, prefix, true, &tail, tailLines, 8}; }
};

}  // namespace

TEST_CASE("line segments: whole lines are prefixed at once, a partial line waits for its end") {
  Segmented s;
  s.text.consume("one\ntw", 100, s.sink());
  CHECK(s.batch == "[0]:one\n");
  CHECK(s.text.holdsPartial());
  s.text.consume("o\n", 100, s.sink());
  CHECK(s.batch == "[0]:one\n[0]:two\n");
  CHECK_FALSE(s.text.holdsPartial());
}

TEST_CASE("line segments: a flushed piece stays open and its rest follows unprefixed") {
  Segmented s;
  s.text.consume("loading", 100, s.sink());
  s.text.flushPartial('\0', s.sink());
  s.text.consume("... done\n", 100, s.sink());
  CHECK(s.batch == "[0]:loading... done\n");
}

TEST_CASE("line segments: a lone carriage return goes in front of the next prefix, redraws stay in place") {
  Segmented s;
  s.text.consume("\r10%\r20%\n", 100, s.sink());
  CHECK(s.batch == "\r[0]:10%\r[0]:20%\n");
  // The tail holds the line as a terminal shows it: the last redraw.
  REQUIRE(s.tail.size() == 1);
  CHECK(s.tail.back() == "20%");
}

TEST_CASE("line segments: a line longer than the most held goes out in pieces of one open line") {
  Segmented s;
  s.text.consume("abcdefghij\n", 4, s.sink());
  CHECK(s.batch == "[0]:abcdefghij\n");
}

TEST_CASE("line segments: a stream that ends gets the newline it did not write, and held returns") {
  Segmented s;
  s.text.consume("last", 100, s.sink());
  s.text.flushPartial('\n', s.sink());
  CHECK(s.batch == "[0]:last\n");
  s.text.consume("\r", 100, s.sink());
  CHECK(s.batch == "[0]:last\n");  // held for a segment that never comes
  s.text.flushReturns(s.sink());
  CHECK(s.batch == "[0]:last\n\r");
}

TEST_CASE("line segments: the tail keeps the last lines, each cut to its bound, and not the console's prefix") {
  Segmented s;
  s.text.consume("a\nb\nc\na-very-long-line\n", 100, s.sink(3));
  CHECK(s.tail == std::deque<std::string>{"b", "c", "a-very-l"});
}

TEST_CASE("line segments: a stream kept off the console still fills its tail") {
  Segmented s;
  SegmentSink off{s.batch, s.prefix, false, &s.tail, 3, 8};
  s.text.consume("quiet\n", 100, off);
  CHECK(s.batch.empty());
  CHECK(s.tail == std::deque<std::string>{"quiet"});
}

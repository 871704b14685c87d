// Unit tests of --hang-timeout auto's safety (hang_options.hpp, hang_detector.hpp): the floor
// and the warm-up's span that a step-then-evaluate loop survives, and the generation that makes
// a restart after a learned hang learn afresh, on this node and through the store's text.
#include <catch2/catch.hpp>

#include "drun/agent/failure_summary.hpp"
#include "drun/agent/hang_options.hpp"
#include "drun/common/error.hpp"
#include "hang_detector.hpp"

using namespace drun::agent;
using namespace drun::agent::detail;
using namespace std::chrono_literals;

namespace {

constexpr int64_t kMs = 1000000;

// A rank that beats every `stepMs` for `steps` beats from `t`, then is silent: the detector's
// verdict `silentMs` after the last beat.
std::optional<HangVerdict> afterSteps(const HangOptions& o, LearnedTimeouts& learned, int steps, int64_t stepMs,
                                      int64_t silentMs) {
  HangDetector d(o, 1, &learned);
  ChannelReading r;
  r.valid = true;
  int64_t t = 1000 * kMs;
  for (int i = 0; i < steps; ++i) {
    t += stepMs * kMs;
    r.beats++;
    r.lastBeatNs = t;
    d.observe(0, r, t);
  }
  return d.check(0, t + silentMs * kMs);
}

}  // namespace

TEST_CASE("hang options: auto takes a floor and a warm-up span, with clear errors", "[hangs]") {
  HangOptions d;
  parseHangTimeout("auto", d);
  CHECK(d.learnFloor == 30s);
  CHECK(d.warmupSpan == 60s);
  CHECK(describe(d) == "learned (x5 after 10 in 60s, at least 30s)");
  HangOptions o;
  parseHangTimeout("auto,floor=2s,warmup=0", o);
  CHECK(o.learn);
  CHECK(o.learnFloor == 2s);
  CHECK(o.warmupSpan == 0ms);
  HangOptions w;
  parseHangTimeout("auto,warmup=5m", w);
  CHECK(w.warmupSpan == 300s);
  CHECK(w.learnFloor == 30s);
  for (const char* bad : {"auto,", "auto,floor=0", "auto,floor=", "auto,x=1", "auto,step=3", "auto,floor=1,floor=2",
                          "auto,warmup=-1", "auto,5", "autox", "5,auto"}) {
    HangOptions b;
    INFO(bad);
    CHECK_THROWS_AS(parseHangTimeout(bad, b), drun::InvalidArgument);
  }
}

TEST_CASE("learned timeouts: a step-then-evaluate loop survives its evaluation by default", "[hangs]") {
  HangOptions o;
  o.learn = true;
  // 20 steps of 200 ms, then a 3 s evaluation without heartbeats: 5x the longest interval would
  // be 1.0 s, but 4 s of steps is no warm-up (60 s), and the floor (30 s) is above it anyway.
  LearnedTimeouts learned;
  CHECK(!afterSteps(o, learned, 20, 200, 3000));
  CHECK(!learned.timeout("", o));
  o.warmupSpan = 0ms;
  LearnedTimeouts warm;
  CHECK(!afterSteps(o, warm, 20, 200, 3000));
  CHECK(warm.timeout("", o) == 30s);  // the floor
  auto v = afterSteps(o, warm, 20, 200, 31000);  // a real hang is still caught
  REQUIRE(v);
  CHECK(v->rule == "learned");
  CHECK(v->describe() == "no heartbeat for 31.0s (learned timeout 30.0s)");

  // Warm once the count and the span are both reached: 300 steps of 200 ms span 60 s.
  o.warmupSpan = 60s;
  LearnedTimeouts longRun;
  CHECK(!afterSteps(o, longRun, 300, 200, 0));  // 299 intervals: 59.8 s
  longRun.note("", 200 * kMs);
  CHECK(longRun.timeout("", o) == 30s);
  longRun.note("", 10000 * kMs);  // the evaluation, learned during the warm-up
  CHECK(longRun.timeout("", o) == 50s);
}

TEST_CASE("learned timeouts: forgotten after a learned hang, on every node through the store", "[hangs]") {
  LearnedTimeouts mine, theirs;
  mine.note("", 100 * kMs, 20);
  theirs.note("", 300 * kMs, 20);
  const std::string before = theirs.encode();
  mine.forget();
  CHECK(mine.seen.empty());
  CHECK(mine.generation == 1);
  mine.mergeEncoded(before);  // an older generation's values (a node that shared before): ignored
  CHECK(mine.seen.empty());
  mine.note("step", 50 * kMs);
  theirs.mergeEncoded(mine.encode());  // a newer generation replaces what the other node had
  CHECK(theirs.generation == 1);
  REQUIRE(theirs.seen.size() == 1);
  CHECK(theirs.seen.at("step").longestNs == 50 * kMs);
  CHECK(theirs.seen.at("step").spanNs == 50 * kMs);
  // A hostile generation line is a number or nothing.
  LearnedTimeouts junk;
  junk.mergeEncoded("g banana\nk 7 1 7\n");
  CHECK(junk.generation == 0);
  CHECK(junk.seen.at("").longestNs == 7);
  junk.mergeEncoded("k 9 2 99999999999999999999\n");  // an out-of-range span: skipped
  CHECK(junk.seen.at("").longestNs == 7);

  // Which failures make the agent forget: a hang a learned timeout called, no other.
  drun::rdzv::FailureRecord learnedHang, givenHang, exit1;
  markHang(learnedHang, "no heartbeat for 1.2s (learned timeout 1.0s)", "faulthandler", "");
  markHang(givenHang, "no heartbeat for 1.2s (hang timeout 1.0s)", "faulthandler", "");
  CHECK(isLearnedHang(learnedHang));
  CHECK(!isLearnedHang(givenHang));
  CHECK(!isLearnedHang(exit1));
}

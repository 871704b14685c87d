// Unit tests of hang detection's pure parts: --hang-timeout parsing, the channel page as untrusted
// input, the detector's rules (silence, sections, learned), the timer FIFO's request parsing, and
// the hang summary. Time is passed in: no sleeps.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>

#include "drun/agent/failure_summary.hpp"
#include "drun/agent/hang_options.hpp"
#include "drun/common/error.hpp"
#include "drun/worker_channel.h"
#include "hang_detector.hpp"
#include "timer_fifo.hpp"

using namespace drun::agent;
using namespace drun::agent::detail;
using namespace std::chrono_literals;

namespace {

constexpr int64_t kSecond = 1000000000;

// A page as a worker would leave it.
struct Page {
  uint64_t beats = 0;
  int64_t lastBeatNs = 0;
  uint64_t seq = 0;
  uint64_t sectionSeq = 0;
  int64_t sectionStartNs = 0;
  std::string section;

  ChannelReading reading() const {
    ChannelReading r;
    r.valid = true;
    r.beats = beats;
    r.lastBeatNs = lastBeatNs;
    r.sectionSeq = sectionSeq;
    r.sectionStartNs = sectionStartNs;
    r.section = section;
    return r;
  }
};

// A channel file in a fresh directory.
struct ChannelFile {
  std::filesystem::path dir = [] {
    char pattern[] = "/tmp/drun-hang-unit-XXXXXX";
    return std::filesystem::path(::mkdtemp(pattern));
  }();
  std::filesystem::path path = dir / "channel";
  int fd = createChannel(path.string());
  ~ChannelFile() {
    ::close(fd);
    std::filesystem::remove_all(dir);
  }
  void write(int offset, const void* bytes, size_t n) { REQUIRE(::pwrite(fd, bytes, n, offset) == static_cast<ssize_t>(n)); }
};

}  // namespace

TEST_CASE("hang options: --hang-timeout seconds, sections, auto, and clear errors", "[hangs]") {
  HangOptions o;
  parseHangTimeout("5", o);
  CHECK(o.silence == 5000ms);
  HangOptions s;
  parseHangTimeout("step=180,checkpoint=15m,90", s);
  CHECK(s.sections.at("step") == 180s);
  CHECK(s.sections.at("checkpoint") == 900s);
  CHECK(s.silence == 90s);
  HangOptions a;
  parseHangTimeout("auto", a);
  CHECK(a.learn);
  CHECK(describe(s) == "no heartbeat for 90s; checkpoint=900s; step=180s");
  for (const char* bad : {"", "x", "0", "5,6", ",5", "step=", "=5", "a b=5,c=1,", "step=1,step=2"}) {
    HangOptions b;
    INFO(bad);
    CHECK_THROWS_AS(parseHangTimeout(bad, b), drun::InvalidArgument);
  }
  HangOptions i;
  parseHangIdle("2m", i);
  CHECK(i.idle == 120s);
  CHECK_THROWS_AS(parseHangIdle("-1", i), drun::InvalidArgument);
}

TEST_CASE("channel: a fresh page reads as no beats, a scribbled page is refused, never trusted", "[hangs]") {
  ChannelFile file;
  ChannelReading fresh = readChannel(file.fd);
  CHECK(fresh.valid);
  CHECK(fresh.beats == 0);
  CHECK(fresh.section.empty());

  SECTION("a section name without its NUL") {
    std::string full(DRUN_CHANNEL_SECTION_MAX, 'x');
    file.write(DRUN_CHANNEL_OFF_SECTION, full.data(), full.size());
    ChannelReading r = readChannel(file.fd);
    CHECK(!r.valid);
    CHECK(r.problem == "section name not NUL-terminated");
  }
  SECTION("a section name with control bytes") {
    const char name[] = "st\x1b[2Jep";
    file.write(DRUN_CHANNEL_OFF_SECTION, name, sizeof name);
    CHECK(readChannel(file.fd).problem == "section name not printable");
  }
  SECTION("a wrong magic") {
    uint32_t magic = 0;
    file.write(DRUN_CHANNEL_OFF_MAGIC, &magic, sizeof magic);
    CHECK(readChannel(file.fd).problem == "bad magic or version");
  }
  SECTION("a truncated file") {
    REQUIRE(::ftruncate(file.fd, 10) == 0);
    CHECK(readChannel(file.fd).problem == "short read (the file was truncated)");
  }
  SECTION("a seqlock held odd keeps the beats but not the section") {
    uint64_t seq = 1, beats = 7;
    file.write(DRUN_CHANNEL_OFF_SEQ, &seq, sizeof seq);
    file.write(DRUN_CHANNEL_OFF_BEATS, &beats, sizeof beats);
    ChannelReading r = readChannel(file.fd);
    CHECK(r.valid);
    CHECK(r.beats == 7);
    CHECK(!r.sectionStable);
  }
}

TEST_CASE("detector: silence after heartbeats is a hang, no heartbeat ever is none", "[hangs]") {
  HangOptions o;
  o.silence = 5s;
  HangDetector d(o, 2, nullptr);
  Page p;
  d.observe(0, p.reading(), 1 * kSecond);
  CHECK(!d.check(0, 100 * kSecond));  // never beat: not checked
  p.beats = 1;
  p.lastBeatNs = 10 * kSecond;
  d.observe(0, p.reading(), 10 * kSecond);
  CHECK(!d.check(0, 15 * kSecond));
  auto v = d.check(0, 15 * kSecond + 1000000);
  REQUIRE(v);
  CHECK(v->rule == "no heartbeat");
  CHECK(v->timeout == 5s);
  CHECK(v->describe() == "no heartbeat for 5.0s (hang timeout 5.0s)");
  d.retire(0);
  CHECK(!d.check(0, 100 * kSecond));
}

TEST_CASE("detector: a worker's clock from the future counts as the agent's now", "[hangs]") {
  HangOptions o;
  o.silence = 5s;
  HangDetector d(o, 1, nullptr);
  Page p;
  p.beats = 1;
  p.lastBeatNs = 1000 * kSecond;  // a lie: in the future
  d.observe(0, p.reading(), 10 * kSecond);
  CHECK(!d.check(0, 14 * kSecond));
  CHECK(d.check(0, 16 * kSecond));
}

TEST_CASE("detector: a section past its timeout is a hang while heartbeats go on", "[hangs]") {
  HangOptions o;
  o.silence = 60s;
  o.sections["ckpt"] = 2s;
  HangDetector d(o, 1, nullptr);
  Page p;
  p.beats = 1;
  p.lastBeatNs = kSecond;
  p.sectionSeq = 1;
  p.section = "ckpt";
  p.sectionStartNs = kSecond;
  for (int64_t t = 1; t <= 3; ++t) {  // beating every second inside the section
    p.beats++;
    p.lastBeatNs = t * kSecond;
    d.observe(0, p.reading(), t * kSecond);
  }
  auto v = d.check(0, 3 * kSecond + 2000000);
  REQUIRE(v);
  CHECK(v->rule == "section");
  CHECK(v->section == "ckpt");
  CHECK(v->describe() == "in section \"ckpt\" for 2.0s (its timeout 2.0s), last heartbeat 2ms ago");
}

TEST_CASE("detector: learned timeouts wait for the warm-up, then take 5x the longest interval", "[hangs]") {
  HangOptions o;
  o.learn = true;
  o.warmup = 3;
  o.warmupSpan = 0ms;  // the count alone (hang_learn_test.cpp tests the span)
  o.learnFloor = 100ms;
  LearnedTimeouts learned;
  HangDetector d(o, 1, &learned);
  Page p;
  int64_t t = kSecond;
  auto beat = [&](int64_t gapMs) {
    t += gapMs * 1000000;
    p.beats++;
    p.lastBeatNs = t;
    d.observe(0, p.reading(), t);
  };
  beat(0);
  beat(100);
  beat(300);  // the longest
  CHECK(!d.check(0, t + 100 * kSecond));  // 2 intervals seen: still warming up
  beat(200);
  CHECK(learned.timeout("", o) == 1500ms);
  CHECK(!d.check(0, t + 1500 * 1000000LL));
  auto v = d.check(0, t + 1501 * 1000000LL);
  REQUIRE(v);
  CHECK(v->rule == "learned");
}

TEST_CASE("timer FIFO: torch's requests acquire and release, bad lines are refused", "[hangs]") {
  boost::asio::io_context io;
  char pattern[] = "/tmp/drun-timer-unit-XXXXXX";
  std::filesystem::path dir = ::mkdtemp(pattern);
  {
    TimerFifo fifo(io, dir / "timer");
    std::string why;
    CHECK(fifo.apply(R"({"version": 1, "pid": 42, "scope_id": "load", "expiration_time": 100.5, "signal": 9})", &why));
    CHECK(fifo.apply(R"({"version": 1, "pid": 42, "scope_id": "save", "expiration_time": 200, "signal": 9})", &why));
    CHECK(fifo.size() == 2);
    CHECK(fifo.apply(R"({"version": 1, "pid": 42, "scope_id": "save", "expiration_time": -1, "signal": 0})", &why));
    CHECK(fifo.expired(100.0).empty());
    auto due = fifo.expired(101.0);
    REQUIRE(due.size() == 1);
    CHECK(due[0].scope == "load");
    CHECK(due[0].signal == 9);
    CHECK(fifo.size() == 0);
    for (const char* bad : {"", "[]", "not json", R"({"version": 2, "pid": 1, "scope_id": "a", "expiration_time": 1})",
                            R"({"version": 1, "pid": -3, "scope_id": "a", "expiration_time": 1})",
                            R"({"version": 1, "pid": 1, "scope_id": 7, "expiration_time": 1})",
                            R"({"version": 1, "pid": 1, "scope_id": "a", "expiration_time": "soon"})"}) {
      INFO(bad);
      CHECK(!fifo.apply(bad, &why));
      CHECK(!why.empty());
    }
    // Lines written to the FIFO are read on the loop.
    int w = ::open((dir / "timer").c_str(), O_WRONLY | O_NONBLOCK);
    REQUIRE(w >= 0);
    std::string line = R"({"version": 1, "pid": 7, "scope_id": "x", "expiration_time": 5, "signal": 9})" "\n";
    REQUIRE(::write(w, line.data(), line.size()) == static_cast<ssize_t>(line.size()));
    ::close(w);
    for (int i = 0; i < 100 && fifo.size() == 0; ++i) io.run_for(10ms);
    CHECK(fifo.size() == 1);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("hang summary: the rank, hung, the verdict and the stack", "[hangs]") {
  drun::rdzv::FailureRecord r;
  r.rank = 3;
  r.localRank = 1;
  r.node = "vm2";
  r.signal = 9;
  r.pid = 77;
  markHang(r, "no heartbeat for 5.1s (hang timeout 5.0s)", "eu-stack", "#0 pause\n#1 main\n");
  CHECK(isHang(r));
  CHECK(describeStatus(r) == "hung: no heartbeat for 5.1s (hang timeout 5.0s)");
  std::string text = formatFailureSummary(r);
  CHECK(text.find("drun: root cause: rank 3 (local_rank 1) on vm2 hung: no heartbeat for 5.1s") == 0);
  CHECK(text.find("drun:   its stack (eu-stack):\ndrun:     #0 pause\ndrun:     #1 main") != std::string::npos);
}

TEST_CASE("detector: a rank silent inside a collective is a waiter: twice the timeout", "[hangs]") {
  HangOptions o;
  o.silence = 2s;
  HangDetector d(o, 2, nullptr);
  Page waiter, culprit;
  waiter.beats = culprit.beats = 1;
  waiter.lastBeatNs = culprit.lastBeatNs = kSecond;
  ChannelReading inside = waiter.reading();
  inside.collective = "all_reduce #6 of world";
  inside.collectiveStartNs = kSecond;
  d.observe(0, inside, kSecond);
  d.observe(1, culprit.reading(), kSecond);
  const int64_t later = 3 * kSecond + 2000000;  // both silent 2 s and a bit
  CHECK(!d.check(0, later));
  REQUIRE(d.check(1, later));
  auto v = d.check(0, 5 * kSecond + 2000000);
  REQUIRE(v);
  CHECK(v->timeout == 4s);
  CHECK(v->describe() == "no heartbeat for 4.0s (hang timeout 4.0s), waiting in all_reduce #6 of world for 4.0s");
}

TEST_CASE("learned timeouts: shared as text, merged by maximum, junk from the store skipped", "[hangs]") {
  LearnedTimeouts a, b;
  a.note("", 100000000);
  a.note("step", 300000000);
  b.note("step", 500000000);
  b.note("step", 200000000);
  b.mergeEncoded(a.encode() + "junk\nk 1\nkzz 1 2\nk00 1 1\nk73 -5 1\n" + std::string(100, 'k') + " 1 1\n");
  REQUIRE(b.seen.size() == 2);
  CHECK(b.seen.at("").longestNs == 100000000);
  CHECK(b.seen.at("step").longestNs == 500000000);
  CHECK(b.seen.at("step").count == 2);
  LearnedTimeouts c;
  c.mergeEncoded(b.encode());
  CHECK(c.encode() == b.encode());
}

// The elastic core's fault matrix (fault_matrix_test.cpp says more): how the job ends. The store
// host's node finishing first or last, the store host SIGKILLed, SIGTERM to every agent, a
// malformed error file, one command started twice, a spare paused around the job's end.
#include <signal.h>

#include <catch2/catch.hpp>
#include <thread>

#include "drun/common/test_skip.hpp"
#include "fault_matrix.hpp"
#include "process.hpp"

using namespace drun::test;
using namespace drun::test::fault_matrix;
using namespace std::chrono_literals;

TEST_CASE("fault matrix: the store host's node finishes first and serves until the job is done",
          "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(2, "2", "0:*:done 1:*:done");  // ranks 0-1 (the store host's node) end at once
  Process a(m.on(0)), b(m.on(1));
  REQUIRE(saysOnStderr(a, "waiting for the other 1 node(s)"));
  REQUIRE(b.waitForLines("world=4", 2, kSeen));
  CHECK(running(a.pid()));  // still there, serving the store and waiting in the barrier
  m.release();
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  CHECK(m.nothingLeft());
}

TEST_CASE("fault matrix: the store host SIGKILLed: the others fence and exit with a clear error",
          "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(2, "2", "");
  m.conf("reconnect_timeout=3");  // nobody restarts the host: the others give up after 3 s
  Process a(m.on(0)), b(m.on(1));
  awaitRound({&a, &b}, 4);
  a.signal(SIGKILL);
  RunResult r = b.wait();
  INFO(r.describe());
  CHECK(r.status() == 1);
  CHECK_THAT(r.err, Catch::Contains("lost the rendezvous store"));
  CHECK_THAT(r.err, Catch::Contains("within 3s (--rdzv-conf reconnect_timeout)"));
  CHECK(r.wall < 40s);
  CHECK(m.nothingLeft());
}

TEST_CASE("fault matrix: SIGTERM to every agent: the job stops with exit 143 and nothing left",
          "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(2, "2", "");
  Process a(m.on(0)), b(m.on(1));
  awaitRound({&a, &b}, 4);
  a.signal(SIGTERM);
  b.signal(SIGTERM);
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 143);
  CHECK(m.nothingLeft());
}

TEST_CASE("fault matrix: a malformed error file: a summary on every node and no abort",
          "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(2, "2", "3:0:badfile");
  Process a(m.on(0)), b(m.on(1));
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) {
    CHECK(r.status() == 1);
    CHECK_THAT(r.err, Catch::Contains("drun: root cause: rank 3 (local_rank 1) on "));
  }
  CHECK(m.nothingLeft());
}

TEST_CASE("fault matrix: the same --nnodes 1 command started twice with one id: the second waits "
          "and runs nothing beside the first", "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(1, "1", "");
  Process a(m.on(0));
  awaitRound({&a}, 2);
  Process twin(m.on(0));
  REQUIRE(saysOnStderr(twin, "waits as a spare"));
  CHECK_FALSE(twin.waitForLines("FM host=0", 1, 1500ms));  // no second job with rank 0
  m.release();
  std::vector<RunResult> runs = {a.wait(), twin.wait()};
  INFO(describe(runs));
  CHECK(runs[0].status() == 0);
  CHECK(runs[1].status() == 0);  // a spare ends with the job's code
  CHECK(seen(runs[1].out).empty());
  CHECK(m.nothingLeft());
}

TEST_CASE("fault matrix: the store host finishes last while its peer is paused in the exit "
          "barrier: every node exits 0", "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(2, "2", "2:*:done 3:*:done");  // node 1's ranks end at once, node 0's on release
  Process a(m.on(0)), b(m.on(1));
  REQUIRE(saysOnStderr(b, "waiting for the other 1 node(s)"));
  b.signal(SIGSTOP);  // a loaded node, a GC pause
  m.release();
  REQUIRE(a.waitForOutput([](const std::string& out, const std::string&) {
    return out.find("FM host=0") != std::string::npos;
  }, kSeen));
  // The fault itself, not a synchronisation: the peer stays paused 0.6 s (the case),
  // long enough for the host's workers to end and its barrier to run without it.
  std::this_thread::sleep_for(600ms);
  b.signal(SIGCONT);
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  CHECK(m.nothingLeft());
}

TEST_CASE("fault matrix: a spare paused around the job's end still ends with the job's code",
          "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(3, "2", "");
  m.conf("heartbeat_timeout=5");  // the pause stays well within the spare's lease
  Process a(m.on(0)), b(m.on(1));
  awaitRound({&a, &b}, 4);
  RunOptions spareRun = m.on(2);
  spareRun.env.push_back("DRUN_LOG_LEVEL=debug");  // for its "joined round" line
  Process spare(spareRun);
  // Paused once it joined (counted in `present`): "waits as a spare" comes before its join, and a
  // spare paused in between is rightly not waited for (the host would exit at once).
  REQUIRE(saysOnStderr(spare, "waits as a spare"));
  REQUIRE(saysOnStderr(spare, "joined round"));
  spare.signal(SIGSTOP);
  m.release();
  RunResult rb = b.wait();
  CHECK(rb.status() == 0);
  CHECK(running(a.pid()));  // the store's host waits for the paused spare
  spare.signal(SIGCONT);
  std::vector<RunResult> runs = {a.wait(), spare.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  CHECK(m.nothingLeft());
}

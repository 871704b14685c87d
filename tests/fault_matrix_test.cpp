// The elastic core's fault matrix: real drun agents on network-namespace hosts (scripts/netns.sh),
// the c10d rendezvous over TCP, and one fault each: a worker failing (on the store host's node,
// on another), a worker SIGKILLed or ignoring SIGTERM, the budget spent, an agent SIGKILLed, a
// link cut (and back), a node joining, a spare, the store host finishing first or dying,
// SIGTERM to one agent or to all, a malformed error file. Each case checks every agent's exit
// code, the WORLD_SIZE / RANK / TORCHELASTIC_RESTART_COUNT the workers of each round saw, the
// summary, and that nothing of the job is left on any host. SKIPPED without namespaces.
// The cases that do not depend on where the store lives run twice: "fault matrix over etcd: ..."
// puts the rendezvous on a 3-member etcd cluster on three more namespace hosts (SKIPPED without
// etcd).
//
// The worker is a shell script (cheap to start): it prints its place, then does what FM_PLAN
// says for its (rank, restart count), else waits until the test creates FM_DIR/release.
//
// This file: failures, restarts and membership changes; fault_matrix_job_end_test.cpp: how the
// job ends (the store host finishing first, last or dying, SIGTERM to all, a malformed error file,
// a spare paused at the end); the harness: support/fault_matrix.hpp.
#include <signal.h>

#include <catch2/catch.hpp>
#include <thread>

#include "drun/common/test_skip.hpp"
#include "fault_matrix.hpp"
#include "process.hpp"

using namespace drun::test;
using namespace drun::test::fault_matrix;
using namespace std::chrono_literals;

namespace {

// A worker fails once; the job restarts on every node with TORCHELASTIC_RESTART_COUNT 1.
void failOnceAndRestart(int failingRank, Backend backend = Backend::C10d) {
  Matrix m(2, "2", std::to_string(failingRank) + ":0:exit1 *:1:done", {"--max-restarts", "1"},
           backend);
  Process a(m.on(0)), b(m.on(1));
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  const std::vector<const std::string*> outs = {&runs[0].out, &runs[1].out};
  CHECK(ranksOf(outs, 4, 0) == allRanks(4));  // round 0 ran everywhere...
  CHECK(ranksOf(outs, 4, 1) == allRanks(4));  // ...and the restart too, with one restart count
  for (const auto& r : runs) {
    CHECK_THAT(r.err, Catch::Contains("rank " + std::to_string(failingRank)) &&
                          Catch::Contains("restarting the job"));
    for (const Seen& s : seen(r.out)) CHECK(s.restart <= 1);
  }
  CHECK(m.nothingLeft());
}

void workerSigkilled(Backend backend) {
  Matrix m(2, "2", "2:0:kill *:1:done", {"--max-restarts", "1"}, backend);
  Process a(m.on(0)), b(m.on(1));
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) {
    CHECK(r.status() == 0);
    CHECK_THAT(r.err, Catch::Contains("signal SIGKILL"));
  }
  CHECK(ranksOf({&runs[0].out, &runs[1].out}, 4, 1) == allRanks(4));
  CHECK(m.nothingLeft());
}

void budgetSpent(Backend backend) {
  Matrix m(2, "2", "1:*:exit5 *:*:done", {"--max-restarts", "2"}, backend);
  Process a(m.on(0)), b(m.on(1));
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  const std::vector<const std::string*> outs = {&runs[0].out, &runs[1].out};
  for (int restart = 0; restart <= 2; ++restart) CHECK(ranksOf(outs, 4, restart).count(1) == 1);
  CHECK(ranksOf(outs, 4, 3).empty());
  for (const auto& r : runs) {
    CHECK(r.status() == 5);
    CHECK_THAT(r.err, Catch::Contains("drun: root cause: rank 1 (local_rank 1) on ") &&
                          Catch::Contains("exited with code 5"));
    CHECK_THAT(r.err, Catch::Contains("restart budget exhausted (2 restarts)"));
  }
  CHECK(m.nothingLeft());
}

void scaleUpThenAgentKilled(Backend backend) {
  Matrix m(3, "2:3", "", {}, backend);
  Process a(m.on(0)), b(m.on(1));
  REQUIRE(a.waitForLines("FM host=0", 2, kSeen));
  Process c(m.on(2));
  awaitRound({&a, &b, &c}, 6);  // the third node was taken in
  c.signal(SIGKILL);
  REQUIRE(a.waitForLines("world=4", 4, kSeen));  // a second round of 4
  REQUIRE(b.waitForLines("world=4", 4, kSeen));
  m.release();
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  // Two rounds of 4 (before the third node and after its loss), one of 6; no restart spent.
  CHECK(ranksOf({&runs[0].out, &runs[1].out}, 4, 0) == allRanks(4, 2));
  CHECK(ranksOf({&runs[0].out, &runs[1].out}, 6, 0).size() == 4);
  CHECK(c.wait().signal == SIGKILL);
  CHECK(m.nothingLeft());
}

// Host 0's workers succeed at once (it waits in the exit barrier); host 2 then arrives. Host 1
// must not stop its workers to take host 2 in: a finished node's round runs to the job's end
// (before, host 1 re-formed, waited in the next round for host 0 until the join timeout, and
// host 0 waited in the barrier for host 1).
void newcomerWhileANodeFinished(Backend backend) {
  Matrix m(3, "2:3", "0:*:done 1:*:done", {}, backend);
  const std::filesystem::path eventsOfB = m.dir.path() / "events1";
  RunOptions onB = m.on(1);
  onB.argv.insert(std::find(onB.argv.begin(), onB.argv.end(), drunPath().string()) + 1,
                  {"--events", eventsOfB.string()});
  Process a(m.on(0)), b(onB);
  REQUIRE(saysOnStderr(a, "waiting for the other 1 node(s)"));
  REQUIRE(b.waitForLines("world=4", 2, kSeen));
  Process c(m.on(2));
  REQUIRE(saysOnStderr(b, "not taking the waiting node(s) in: a node of this job already "
                          "finished; the workers go on"));
  CHECK(countNow(b, "FM host=1") == 2);  // its workers of round 0 still run, not restarted
  m.release();
  std::vector<RunResult> runs = {a.wait(), b.wait(), c.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  CHECK_THAT(runs[2].err, Catch::Contains("the job finished (every worker succeeded) while this "
                                          "node waited to join it"));
  CHECK(ranksOf({&runs[0].out, &runs[1].out, &runs[2].out}, 6, 0).empty());  // no round of 3
  // The job's events say it too, not only the console.
  const std::string events = slurp(eventsOfB);
  INFO(events);
  CHECK(contains(events, R"("event":"scale_up_refused")"));
  CHECK(contains(events, R"("reason":"a node of this job already finished")"));
  CHECK(m.nothingLeft());
}

void linkCut(Backend backend) {
  Matrix m(3, "2:3", "", {}, backend);
  Process a(m.on(0)), b(m.on(1)), c(m.on(2));
  awaitRound({&a, &b, &c}, 6);
  const size_t a4 = countNow(a, "world=4"), b4 = countNow(b, "world=4");
  const size_t a6 = countNow(a, "world=6"), c6 = countNow(c, "world=6");
  const auto cutAt = std::chrono::steady_clock::now();
  m.link(2, false);
  // The others: the cut node's lease lapses (heartbeat_timeout=2), they re-form with two.
  REQUIRE(a.waitForLines("world=4", a4 + 2, kSeen));
  REQUIRE(b.waitForLines("world=4", b4 + 2, kSeen));
  // The cut node stopped its own workers (it cannot know whether the job went on without it).
  REQUIRE(saysOnStderr(c, "lost the rendezvous store"));
  CHECK(std::chrono::steady_clock::now() - cutAt < 10s);  // within heartbeat_timeout, and then some
  m.link(2, true);
  // It reconnects and joins as a new node: the job takes it in again (6 workers).
  REQUIRE(a.waitForLines("world=6", a6 + 2, kSeen));
  REQUIRE(c.waitForLines("world=6", c6 + 2, kSeen));
  m.release();
  std::vector<RunResult> runs = {a.wait(), b.wait(), c.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  for (const auto& r : runs)
    for (const Seen& s : seen(r.out)) CHECK(s.restart == 0);  // membership changes are free
  CHECK(m.nothingLeft());
}

void spareReplacesLostMember(Backend backend) {
  Matrix m(3, "2", "", {}, backend);
  Process a(m.on(0)), b(m.on(1));
  awaitRound({&a, &b}, 4);
  Process spare(m.on(2));
  REQUIRE(saysOnStderr(spare, "waits as a spare"));
  // No churn: the running workers are untouched while the spare waits.
  CHECK_FALSE(a.waitForLines("FM host=0", 3, 1500ms));
  b.signal(SIGKILL);
  REQUIRE(a.waitForLines("FM host=0", 4, kSeen));
  REQUIRE(spare.waitForLines("world=4", 2, kSeen));
  m.release();
  std::vector<RunResult> runs = {a.wait(), spare.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  CHECK(ranksOf({&runs[0].out, &runs[1].out}, 4, 0).size() == 6);  // 2 rounds on a, 1 on spare
  CHECK(m.nothingLeft());
}

void sigtermToOneAgent(Backend backend) {
  Matrix m(3, "2:3", "", {}, backend);
  Process a(m.on(0)), b(m.on(1)), c(m.on(2));
  awaitRound({&a, &b, &c}, 6);
  const size_t a4 = countNow(a, "world=4");
  c.signal(SIGTERM);
  REQUIRE(a.waitForLines("world=4", a4 + 2, kSeen));
  m.release();
  std::vector<RunResult> runs = {a.wait(), b.wait(), c.wait()};
  INFO(describe(runs));
  CHECK(runs[0].status() == 0);
  CHECK(runs[1].status() == 0);
  CHECK(runs[2].status() == 143);
  CHECK(m.nothingLeft());
}

void replacementStartedLater(Backend backend) {
  Matrix m(3, "2", "", {}, backend);
  Process a(m.on(0)), b(m.on(1));
  awaitRound({&a, &b}, 4);
  b.signal(SIGKILL);
  REQUIRE(saysOnStderr(a, "for replacement node(s)"));
  Process c(m.on(2));  // a Kubernetes pod restart, a requeue, an operator
  REQUIRE(c.waitForLines("world=4 restart=0", 2, kSeen));
  REQUIRE(a.waitForLines("world=4 restart=0", 4, kSeen));  // its second round
  m.release();
  std::vector<RunResult> runs = {a.wait(), c.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  CHECK(b.wait().signal == SIGKILL);
  CHECK(m.nothingLeft());
}

}  // namespace

TEST_CASE("fault matrix: a worker on the store host's node exits 1 once: every node restarts",
          "[multinode]") {
  skipWithoutNetns("fault matrix");
  failOnceAndRestart(0);  // node rank 0 hosts the store (host 0 arrives first, ranks 0-1)
}

TEST_CASE("fault matrix: a worker on another node exits 1 once: every node restarts",
          "[multinode]") {
  skipWithoutNetns("fault matrix");
  failOnceAndRestart(3);
}

TEST_CASE("fault matrix over etcd: a worker exits 1 once: every node "
          "restarts", "[multinode][etcd]") {
  skipWithoutNetns("fault matrix");
  failOnceAndRestart(3, Backend::Etcd);
}

ON_BOTH_BACKENDS("a worker SIGKILLed: the job restarts everywhere", workerSigkilled)

ON_BOTH_BACKENDS("budget spent: K+1 attempts on every node and one root cause "
                 "everywhere", budgetSpent)

TEST_CASE("fault matrix: a worker ignoring SIGTERM is SIGKILLed after the grace", "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(2, "2", "0:0:exit1 2:0:ignoreterm");
  Process a(m.on(0)), b(m.on(1));
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) {
    CHECK(r.status() == 1);
    CHECK_THAT(r.err, Catch::Contains("drun: root cause: rank 0 (local_rank 0) on "));
    CHECK(r.wall < 20s);  // grace 2 s: SIGKILL, not a hang
  }
  CHECK(m.nothingLeft());
}

ON_BOTH_BACKENDS("scale-up 2 to 3 then an agent SIGKILLed: the others go on with "
                 "2", scaleUpThenAgentKilled)

TEST_CASE("fault matrix: an agent SIGKILLed in a 2:2 job with replace_timeout=0: a clear error "
          "naming it", "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(2, "2", "");
  m.conf("replace_timeout=0");
  Process a(m.on(0)), b(m.on(1));
  awaitRound({&a, &b}, 4);
  b.signal(SIGKILL);
  RunResult r = a.wait();
  INFO(r.describe());
  CHECK(r.status() == 1);
  CHECK_THAT(r.err, Catch::Contains("the job lost node(s) ") &&
                        Catch::Contains("lost node(s) " + m.cluster.address(1)) &&
                        Catch::Contains("fewer than the minimum of 2"));
  CHECK(r.wall < 30s);
  CHECK(m.nothingLeft());
}

ON_BOTH_BACKENDS("a node arrives after another's workers succeeded: the job runs to its end "
                 "without re-forming, the newcomer learns the end", newcomerWhileANodeFinished)

ON_BOTH_BACKENDS("a link cut: the cut node fences its workers and the others re-form and it comes "
                 "back with the link", linkCut)

ON_BOTH_BACKENDS("a spare beyond MAX causes no restart and replaces a lost "
                 "member", spareReplacesLostMember)

ON_BOTH_BACKENDS("SIGTERM to one agent: it leaves and the others go on without "
                 "it", sigtermToOneAgent)

ON_BOTH_BACKENDS("an agent SIGKILLed in a 2:2 job: a replacement started later takes its place, "
                 "at no restart", replacementStartedLater)

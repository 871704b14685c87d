// The c10d rendezvous, several agents in one process (c10d_rendezvous_test.cpp says how): members
// that go silent or leave, late joiners and spares, failures and the restart count, the exit
// barrier, lost members and re-forming rounds.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <future>
#include <set>
#include <thread>

#include "drun/common/deadline.hpp"
#include "drun/common/error.hpp"
#include "drun/rendezvous/c10d_rendezvous.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/store/memory_store.hpp"
#include "drun/rendezvous/port_reservation.hpp"
#include "drun/store/store_server.hpp"
#include "drun/store/tcp_store.hpp"
#include "c10d_test_support.hpp"

extern char** environ;

using namespace drun;
using namespace drun::rdzv;
using namespace std::chrono_literals;

using namespace drun::rdzv::test;

TEST_CASE("c10d: a silent agent (heartbeats stopped) is dropped after its lease",
          "[rendezvous]") {
  TcpCluster cluster;
  auto a = cluster.agent(withNode(options(2, 2), "hostA"));
  TcpStore* victimStore = nullptr;
  auto victimOptions = withNode(options(2, 2), "victim");
  victimOptions.joinTimeout = 3s;
  auto v = cluster.agent(victimOptions, &victimStore);
  auto fa = startNext(*a);
  awaitArrivals(cluster.store(), "job", 0, 1);
  victimStore->stopHeartbeatsForTest();
  auto fv = startNext(*v);
  awaitArrivals(cluster.store(), "job", 0, 2);
  // The round closed at once with both (MAX reached); the silent one dies after its lease and
  // the membership changes.
  REQUIRE(fv.wait_for(kHang) == std::future_status::ready);
  FirstChange change(*a);
  auto ra = getWithin(fa);
  CHECK(ra.nodeCount == 2);
  CHECK_THAT(change.get(), Catch::Contains("victim"));
}

TEST_CASE("c10d: membership change fires when a node's connection dies", "[rendezvous]") {
  TcpCluster cluster;
  auto a = cluster.agent(withNode(options(2, 2), "hostA"));
  auto b = cluster.agent(withNode(options(2, 2), "hostB"));
  FirstChange change(*a);
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  getWithin(fa);
  getWithin(fb);
  b.reset();  // closes hostB's connection without leave(): its will runs
  CHECK_THAT(change.get(), Catch::Contains("hostB") && Catch::Contains("left round 0"));
}

TEST_CASE("c10d: a late joiner waits, the running nodes are told, and the next round takes it",
          "[rendezvous]") {
  MemoryCluster cluster;
  auto a = cluster.agent(withNode(options(2, 3), "hostA"));
  auto b = cluster.agent(withNode(options(2, 3), "hostB"));
  FirstChange change(*a);
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  checkRound({getWithin(fa), getWithin(fb)}, {1, 1});

  auto c = cluster.agent(withNode(options(2, 3), "hostC"));
  auto fc = startNext(*c);
  CHECK_THAT(change.get(), Catch::Contains("hostC is waiting to join"));

  // The running nodes re-rendezvous: three of MAX three, closes at once.
  fa = startNext(*a);
  fb = startNext(*b);
  std::vector<RoundResult> results = {getWithin(fa), getWithin(fb), getWithin(fc)};
  checkRound(results, {1, 1, 1});
  CHECK(results[0].round == 1);
  for (auto* r : {a.get(), b.get(), c.get()}) r->leave();
  CHECK(keysBesidesTombstone(cluster.store(), "job") == 0);
}

TEST_CASE("c10d: leave() notifies nobody, and a spare beyond MAX disturbs nobody", "[rendezvous]") {
  MemoryCluster cluster;
  auto a = cluster.agent(withNode(options(2, 2), "hostA"));
  auto b = cluster.agent(withNode(options(2, 2), "hostB"));
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  getWithin(fa);
  getWithin(fb);
  FirstChange change(*a);
  // A third node while the job has MAX nodes: a spare, it waits without telling anyone (and
  // outlives its join timeout while the job runs).
  auto o = options(2, 2);
  o.joinTimeout = 300ms;
  auto c = cluster.agent(withNode(o, "hostC"));
  auto fc = startNext(*c);
  b->leave();
  CHECK(cluster.store().numKeys() > 0);  // hostA is still attached: the job's keys stay
  b.reset();
  CHECK_FALSE(change.reportedWithin(700ms));
  CHECK(fc.wait_for(0ms) == std::future_status::timeout);
  // The job's last member leaves: with nobody left to replace, the spare gives up.
  a->leave();
  CHECK_THROWS_AS(getWithin(fc), TimeoutError);
}

TEST_CASE("c10d: a failure anywhere is one root cause, and the restart count is the job's",
          "[rendezvous]") {
  MemoryCluster cluster;
  auto [a, b] = runningPair(cluster, /*maxRestarts=*/1);
  FirstChange told(*a, "failed");
  FailureRecord f;
  f.rank = 1;
  f.node = "hostB";
  f.exitCode = 3;
  f.detailSource = "stderr";
  f.detail = "boom\n";
  FailureRecord verdict = b->reportFailure(f);
  CHECK_FALSE(verdict.final);  // budget 1, restarts 0
  CHECK_THAT(told.get(), Catch::Contains("failed"));
  // A second failure in the same round does not replace the root cause.
  FailureRecord later = f;
  later.rank = 0;
  later.node = "hostA";
  CHECK(a->reportFailure(later).node == "hostB");
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  std::vector<RoundResult> second = {getWithin(fa), getWithin(fb)};
  checkRound(second, {1, 1});
  for (const auto& r : second) CHECK(r.restartCount == 1);
  // Budget spent: the next failure is final, and the job's outcome records it.
  FailureRecord last = b->reportFailure(f);
  CHECK(last.final);
  auto outcome = cluster.store().tryGet(keys::outcome("job"));
  REQUIRE(outcome);
  auto recorded = keys::parseOutcome(*outcome);
  REQUIRE(recorded);
  CHECK(recorded->statusCode() == 3);
  CHECK(recorded->detail == "boom\n");
}

TEST_CASE("c10d: the exit barrier: Succeeded once every member finished", "[rendezvous]") {
  MemoryCluster cluster;
  auto [a, b] = runningPair(cluster);
  FirstChange done(*a, "succeeded");
  CHECK(a->finish());
  CHECK_FALSE(done.reportedWithin(300ms));  // b still runs
  CHECK(b->finish());
  CHECK_THAT(done.get(), Catch::Contains("succeeded"));
  a->leave();
  b->leave();
  CHECK(keysBesidesTombstone(cluster.store(), "job") == 0);
}

TEST_CASE("c10d: a lost member: the survivors re-form at once, without the last call",
          "[rendezvous]") {
  MemoryCluster cluster;
  auto o = options(2, 3);
  o.lastCallTimeout = 60s;  // re-forming must not wait for it
  auto a = cluster.agent(withNode(o, "hostA"));
  auto b = cluster.agent(withNode(o, "hostB"));
  auto c = cluster.agent(withNode(o, "hostC"));
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  auto fc = startNext(*c);
  checkRound({getWithin(fa), getWithin(fb), getWithin(fc)}, {1, 1, 1});
  FirstChange lost(*a, "member lost");
  c.reset();  // its will runs
  CHECK_THAT(lost.get(), Catch::Contains("hostC"));
  fa = startNext(*a);
  fb = startNext(*b);
  std::vector<RoundResult> second = {getWithin(fa, 10s), getWithin(fb, 10s)};
  checkRound(second, {1, 1});
  CHECK(second[0].restartCount == 0);  // a lost node costs no restart
  CHECK(second[0].masterPort != 0);
}

TEST_CASE("c10d: a lost member with fewer than MIN left: a clear error naming it",
          "[rendezvous]") {
  MemoryCluster cluster;
  auto [a, b] = runningPair(cluster);
  b.reset();
  auto fa = startNext(*a);
  REQUIRE(fa.wait_for(kHang) == std::future_status::ready);
  REQUIRE_THROWS_WITH(fa.get(), Catch::Contains("lost node(s) hostB") &&
                                    Catch::Contains("fewer than the minimum of 2"));
}

TEST_CASE("c10d: a re-forming member whose partner never comes back times out after the join "
          "timeout", "[rendezvous]") {
  // The partner vanishes without its loss being counted (no will ran: as when a forger on an open
  // store hid its death): the member re-forming waits for it at most the join timeout, not for
  // ever as a spare waits for a running job.
  MemoryCluster cluster;
  auto o = options(2, 2);
  o.joinTimeout = 1s;
  MemoryStore* bStore = nullptr;
  auto a = cluster.agent(withNode(o, "hostA"));
  auto b = cluster.agent(withNode(o, "hostB"), &bStore);
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  checkRound({getWithin(fa), getWithin(fb)}, {1, 1});
  bStore->setWill({});
  b.reset();
  fa = startNext(*a);
  REQUIRE(fa.wait_for(kHang) == std::future_status::ready);
  REQUIRE_THROWS_WITH(fa.get(), Catch::Contains("round 1") && Catch::Contains("timed out after 1000ms") &&
                                    Catch::Contains("1 node(s) joined"));
}

TEST_CASE("c10d: an outcome in the store before any round closed is not believed", "[rendezvous]") {
  // Stale or forged: a first round's joiner that believed it would exit "successfully" without
  // running anything.
  MemoryCluster cluster;
  cluster.store().set(keys::outcome("job"), keys::encodeOutcome(std::nullopt));
  auto a = cluster.agent(withNode(options(2, 2), "hostA"));
  auto b = cluster.agent(withNode(options(2, 2), "hostB"));
  auto fa = startNext(*a);
  awaitArrivals(cluster.store(), "job", 0, 1);
  // An event with MAX arrivals counted: the waiting joiner looks again and, elected, re-evaluates
  // the close (its election key shows it went on instead of ending).
  cluster.store().add(keys::count("job", 0), 1);
  cluster.store().add(keys::status("job", 0), 1);
  cluster.store().wait({keys::reeval("job", 0, "1")}, 10s);
  auto fb = startNext(*b);
  checkRound({getWithin(fa), getWithin(fb)}, {1, 1});
}

// A member whose round formed, but whose watcher's connection got no answer (the store stalled):
// it cannot run the round, so the others must learn that it is gone (its will: lost) instead of
// waiting for it to finish, and it joins again as a newcomer, taken in by the next round.
TEST_CASE("c10d: a member whose watcher cannot connect after its round formed is lost, and joins again",
          "[rendezvous]") {
  MemoryCluster cluster;
  auto o = options(2, 2);
  o.replaceTimeout = 10s;  // hostA may re-form before hostB is back
  auto a = cluster.agent(withNode(o, "hostA"));
  FirstChange lost(*a, "member lost");
  auto watchers = std::make_shared<std::atomic<int>>(0);
  C10dStoreAccess access;
  access.store = std::make_unique<MemoryStore>(cluster.shared);
  access.connectWatcher = [s = cluster.shared, watchers]() -> std::unique_ptr<LivenessStore> {
    if (watchers->fetch_add(1) == 0)
      throw TimeoutError("store at memory did not answer the hello within 1000ms");
    return std::make_unique<MemoryStore>(s);
  };
  access.endpoint = "memory";
  auto b = makeC10dRendezvous(withNode(o, "hostB"), std::move(access));
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  CHECK(getWithin(fa).round == 0);
  CHECK_THAT(lost.get(), Catch::Contains("hostB"));
  fa = startNext(*a);
  std::vector<RoundResult> second = {getWithin(fa), getWithin(fb)};
  checkRound(second, {1, 1});
  CHECK(second[0].round > 0);
  CHECK(watchers->load() == 3);  // the one that failed, the reconnection, round 1's watcher
}

// The c10d rendezvous: several agents in one process (threads), on MemoryStore and on
// TcpStore + StoreServer over loopback. No sleeps: agents are sequenced through the store
// (watching the round's arrival counter) and results through futures with generous bounds.
// This file: rounds forming and closing, node ranks, timeouts, agents dying while they join, the
// factory. c10d_membership_test.cpp: membership changes, failures and the exit barrier;
// c10d_planning_test.cpp: the pure parts (member choice, round plans, key records).
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

namespace {

template <typename Cluster>
void formsOneRound(Cluster& cluster, const std::vector<int>& localSizes) {
  const int n = static_cast<int>(localSizes.size());
  std::vector<std::unique_ptr<Rendezvous>> agents;
  for (int i = 0; i < n; ++i)
    agents.push_back(cluster.agent(
        withNode(options(n, n), "host" + std::string(1, char('A' + i)), localSizes[i])));
  std::vector<std::future<RoundResult>> futures;
  for (auto& a : agents) futures.push_back(startNext(*a));
  std::vector<RoundResult> results;
  for (auto& f : futures) results.push_back(getWithin(f));
  checkRound(results, localSizes);
  // Node rank 0 is the first host in (host, arrival) order, and MASTER_ADDR is its address.
  for (int i = 0; i < n; ++i)
    if (results[i].nodeRank == 0) CHECK(results[i].masterAddr == "hostA");
  CHECK(results[0].hosts == std::vector<std::string>{"hostA", "hostB", "hostC", "hostD"});
  for (auto& a : agents) a->leave();
}

}  // namespace

TEST_CASE("c10d: four agents on MemoryStore get every rank once, prefix sums of local sizes",
          "[rendezvous]") {
  MemoryCluster cluster;
  formsOneRound(cluster, {2, 1, 4, 3});
  CHECK(keysBesidesTombstone(cluster.store(), "job") == 0);  // the last agent to leave removed the job's keys
}

TEST_CASE("c10d: four agents over TcpStore and StoreServer on loopback", "[rendezvous]") {
  TcpCluster cluster;
  formsOneRound(cluster, {1, 3, 2, 2});
  CHECK(keysBesidesTombstone(cluster.store(), "job") == 0);
}

TEST_CASE("c10d: --node-rank is honoured", "[rendezvous]") {
  MemoryCluster cluster;
  std::vector<std::unique_ptr<Rendezvous>> agents;
  const std::vector<int> wanted = {2, 0, 1};
  for (int i = 0; i < 3; ++i)
    agents.push_back(cluster.agent(withNode(options(3, 3), "h" + std::to_string(i), 2, wanted[i])));
  std::vector<std::future<RoundResult>> futures;
  for (auto& a : agents) futures.push_back(startNext(*a));
  for (int i = 0; i < 3; ++i) {
    auto r = getWithin(futures[i]);
    CHECK(r.nodeRank == wanted[i]);
    CHECK(r.rankOffset == 2 * wanted[i]);
    CHECK(r.masterAddr == "h1");
  }
}

TEST_CASE("c10d: a node rank claimed twice is an error for every agent", "[rendezvous]") {
  MemoryCluster cluster;
  auto a = cluster.agent(withNode(options(2, 2), "hostA", 1, 1));
  auto b = cluster.agent(withNode(options(2, 2), "hostB", 1, 1));
  auto fa = startNext(*a);
  awaitArrivals(cluster.store(), "job", 0, 1);  // names are listed in arrival order
  auto fb = startNext(*b);
  REQUIRE(fa.wait_for(kHang) == std::future_status::ready);
  REQUIRE(fb.wait_for(kHang) == std::future_status::ready);
  REQUIRE_THROWS_WITH(fa.get(), Catch::Contains("node rank 1 claimed by hostA and hostB"));
  REQUIRE_THROWS_WITH(fb.get(), Catch::Contains("node rank 1 claimed by hostA and hostB"));
}

namespace {

// hostA starts job "job" with `first`, then hostB arrives with `second`: both fail at once (not
// after the join timeout, 15 s here) with an error containing `message`.
void checkBothFailAtOnce(const RendezvousOptions& first, const RendezvousOptions& second,
                         const std::string& message) {
  MemoryCluster cluster;
  auto a = cluster.agent(withNode(first, "hostA"));
  auto b = cluster.agent(withNode(second, "hostB"));
  const auto t0 = Clock::now();
  auto fa = startNext(*a);
  awaitArrivals(cluster.store(), "job", 0, 1);
  auto fb = startNext(*b);
  REQUIRE(fa.wait_for(kHang) == std::future_status::ready);
  REQUIRE(fb.wait_for(kHang) == std::future_status::ready);
  CHECK(Clock::now() - t0 < 5s);
  for (auto* f : {&fa, &fb}) REQUIRE_THROWS_WITH(f->get(), Catch::Contains(message));
}

}  // namespace

TEST_CASE("c10d: nodes started with different --nnodes fail at once naming both values",
          "[rendezvous]") {
  checkBothFailAtOnce(options(2, 2), options(3, 3),
                      "nodes disagree on --nnodes: hostB has --nnodes 3, the job (first started on "
                      "hostA) has --nnodes 2");
  // A job that runs goes on without the odd node.
  MemoryCluster running;
  auto x = running.agent(withNode(options(1, 2), "hostX"));
  auto rx = x->next();
  CHECK(rx.nodeCount == 1);
  auto y = running.agent(withNode(options(1, 3), "hostY"));
  REQUIRE_THROWS_WITH(y->next(), Catch::Contains("has --nnodes 1:2"));
  CHECK_FALSE(running.store().check({keys::failure("job", 0)}));
  x->leave();
}

TEST_CASE("c10d: nodes started with different --max-restarts fail at once naming both values",
          "[rendezvous]") {
  auto withBudget = [](RendezvousOptions o, int maxRestarts) {
    o.maxRestarts = maxRestarts;
    return o;
  };
  checkBothFailAtOnce(withBudget(options(2, 2), 1), withBudget(options(2, 2), 3),
                      "nodes disagree on --max-restarts: hostB has --max-restarts 3, the job (first "
                      "started on hostA) has --max-restarts 1");
  // A job that runs goes on without the odd node; the same budget joins it.
  MemoryCluster running;
  auto x = running.agent(withNode(withBudget(options(1, 3), 2), "hostX"));
  CHECK(x->next().nodeCount == 1);
  auto y = running.agent(withNode(withBudget(options(1, 3), 0), "hostY"));
  REQUIRE_THROWS_WITH(y->next(), Catch::Contains("has --max-restarts 2"));
  CHECK_FALSE(running.store().check({keys::failure("job", 0)}));
  x->leave();
}

TEST_CASE("c10d: 2:3 with two agents closes after the last call", "[rendezvous]") {
  TcpCluster cluster;
  auto a = cluster.agent(withNode(options(2, 3), "hostA"));
  auto b = cluster.agent(withNode(options(2, 3), "hostB"));
  const auto t0 = Clock::now();
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  auto ra = getWithin(fa);
  auto rb = getWithin(fb);
  const auto elapsed = Clock::now() - t0;
  checkRound({ra, rb}, {1, 1});
  CHECK(ra.nodeCount == 2);
  CHECK(elapsed >= 300ms);  // waited for the last call...
  CHECK(elapsed < 5s);      // ...and not for the join timeout
}

TEST_CASE("c10d: 3:3 does not close with two agents and the third closes it", "[rendezvous]") {
  MemoryCluster cluster;
  auto a = cluster.agent(withNode(options(3, 3), "hostA"));
  auto b = cluster.agent(withNode(options(3, 3), "hostB"));
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  awaitArrivals(cluster.store(), "job", 0, 2);
  CHECK_FALSE(cluster.store().check({keys::state("job", 0)}));
  auto c = cluster.agent(withNode(options(3, 3), "hostC"));
  auto fc = startNext(*c);
  std::vector<RoundResult> results = {getWithin(fa), getWithin(fb), getWithin(fc)};
  checkRound(results, {1, 1, 1});
  CHECK(results[0].nodeCount == 3);  // had it closed with two, this would say 2
}

TEST_CASE("c10d: the join timeout names who joined and how many were needed", "[rendezvous]") {
  MemoryCluster cluster;
  auto o = options(3, 3);
  o.joinTimeout = 300ms;
  auto a = cluster.agent(withNode(o, "hostA"));
  auto b = cluster.agent(withNode(o, "hostB"));
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  REQUIRE(fa.wait_for(kHang) == std::future_status::ready);
  REQUIRE(fb.wait_for(kHang) == std::future_status::ready);
  try {
    fa.get();
    FAIL("no timeout");
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("timed out after 300ms"));
    CHECK_THAT(what, Catch::Contains("hostA (this node)"));
    CHECK_THAT(what, Catch::Contains("need 3"));
  }
  CHECK_THROWS_AS(fb.get(), TimeoutError);
}

TEST_CASE("c10d: a joiner whose handle dies is not counted (MemoryStore)", "[rendezvous]") {
  MemoryCluster cluster;
  auto a = cluster.agent(withNode(options(3, 3), "hostA"));
  auto b = cluster.agent(withNode(options(3, 3), "hostB"));
  auto victimOptions = withNode(options(3, 3), "victim");
  victimOptions.joinTimeout = 500ms;
  MemoryStore* victimStore = nullptr;
  auto v = cluster.agent(victimOptions, &victimStore);
  auto fa = startNext(*a);
  auto fv = startNext(*v);
  awaitArrivals(cluster.store(), "job", 0, 2);
  victimStore->fireWillForTest();  // as if its connection dropped
  auto fb = startNext(*b);
  awaitArrivals(cluster.store(), "job", 0, 3);
  // Three arrivals, one dead: still open.
  CHECK_FALSE(cluster.store().check({keys::state("job", 0)}));
  auto d = cluster.agent(withNode(options(3, 3), "hostD"));
  auto fd = startNext(*d);
  std::vector<RoundResult> results = {getWithin(fa), getWithin(fb), getWithin(fd)};
  checkRound(results, {1, 1, 1});
  for (const auto& h : results[0].hosts) CHECK(h != "victim");
  // It times out in round 0 (a slow machine), or waits on as a spare while the job runs: either
  // way it is done once the job's members are gone.
  for (auto* r : {a.get(), b.get(), d.get()}) r->leave();
  REQUIRE(fv.wait_for(kHang) == std::future_status::ready);
}

namespace {
// A joiner played by hand on its own MemoryStore handle: will, descriptor, arrival; so a test can
// stop it at any step (as if it died there) with fireWillForTest().
struct HandJoiner {
  MemoryStore store;
  keys::NodeDescriptor self;
  int64_t arrival = 0;

  HandJoiner(MemoryCluster& cluster, const std::string& host) : store(cluster.shared) {
    self.id = "hand-" + host;
    self.host = self.addr = host;
    self.masterPort = 1;
    store.setWill(keys::joinWill("job", 0, self.id, self.displayName()));
    store.append(keys::joined("job", 0), keys::encodeDescriptor(self));
    arrival = store.add(keys::count("job", 0), 1);
  }
};
}  // namespace

TEST_CASE("c10d: a closer that dies after deciding, before publishing: the roster decides",
          "[rendezvous]") {
  MemoryCluster cluster;
  auto a = cluster.agent(withNode(options(3, 3), "hostA"));
  auto b = cluster.agent(withNode(options(3, 3), "hostB"));
  FirstChange change(*a);
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  awaitArrivals(cluster.store(), "job", 0, 2);
  HandJoiner closer(cluster, "hostX");
  REQUIRE(closer.arrival == 3);
  // It decides (compare_set on state) and dies before its multi_set.
  auto nodes = keys::parseJoined(*closer.store.tryGet(keys::joined("job", 0)));
  auto d = decideRound("job", 0, nodes, {});
  REQUIRE(closer.store.compareSet(keys::state("job", 0), "", d.decision) == d.decision);
  closer.store.fireWillForTest();
  std::vector<RoundResult> results = {getWithin(fa), getWithin(fb)};
  for (const auto& r : results) {
    CHECK(r.nodeCount == 3);  // the decision stands, the dead closer included...
    CHECK(r.hosts == std::vector<std::string>{"hostA", "hostB", "hostX"});
  }
  CHECK(results[0].nodeRank != results[1].nodeRank);
  // ...and the running nodes are told at once that one of them is gone.
  CHECK_THAT(change.get(), Catch::Contains("hostX") && Catch::Contains("left round 0"));
}

TEST_CASE("c10d: the MAX-th joiner dies before closing: the round still forms", "[rendezvous]") {
  MemoryCluster cluster;
  auto a = cluster.agent(withNode(options(2, 2), "hostA"));
  auto fa = startNext(*a);
  awaitArrivals(cluster.store(), "job", 0, 1);
  {
    HandJoiner dying(cluster, "hostX");  // arrival 2 = MAX, then gone without closing
    REQUIRE(dying.arrival == 2);
    dying.store.fireWillForTest();
  }
  // hostA re-evaluated (elected) and found one alive: still open. hostB closes it.
  CHECK_FALSE(cluster.store().check({keys::state("job", 0)}));
  auto b = cluster.agent(withNode(options(2, 2), "hostB"));
  auto fb = startNext(*b);
  std::vector<RoundResult> results = {getWithin(fa), getWithin(fb)};
  checkRound(results, {1, 1});
  CHECK(results[0].hosts == std::vector<std::string>{"hostA", "hostB"});
}

// The victim of the next test, in a process of its own: this binary run again (exec, not a bare
// fork of a threaded process) with this hidden test selected and the server's port in the
// environment. It joins and blocks until it is killed.
constexpr const char* kVictimTest = "c10d: victim agent process (started by the SIGKILL test)";
constexpr const char* kVictimPortVar = "RDZV_TEST_VICTIM_PORT";

TEST_CASE(kVictimTest, "[.victim]") {
  const char* port = std::getenv(kVictimPortVar);
  if (!port) return;
  TcpStoreOptions o;
  o.endpoint.port = static_cast<uint16_t>(std::atoi(port));
  C10dStoreAccess access;
  access.store = std::make_unique<TcpStore>(o);
  auto victim = makeC10dRendezvous(withNode(options(2, 3), "victim"), std::move(access));
  victim->next();
}

TEST_CASE("c10d: an agent SIGKILLed during the join does not hang the others", "[rendezvous]") {
  TcpCluster cluster;
  auto a = cluster.agent(withNode(options(2, 3), "hostA"));
  auto fa = startNext(*a);
  awaitArrivals(cluster.store(), "job", 0, 1);

  const std::string portVar = std::string(kVictimPortVar) + "=" + std::to_string(cluster.server.port());
  std::vector<char*> env;
  for (char** e = environ; *e; ++e) env.push_back(*e);
  env.push_back(const_cast<char*>(portVar.c_str()));
  env.push_back(nullptr);
  const char* argv[] = {"/proc/self/exe", kVictimTest, nullptr};
  pid_t child = -1;
  REQUIRE(::posix_spawn(&child, "/proc/self/exe", nullptr, nullptr, const_cast<char**>(argv),
                        env.data()) == 0);
  awaitArrivals(cluster.store(), "job", 0, 2);
  ::kill(child, SIGKILL);  // its connection closes: its will marks it dead in round 0
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status));
  // Without the victim, hostA is alone: the round must not close (MIN is 2)...
  auto b = cluster.agent(withNode(options(2, 3), "hostB"));
  auto fb = startNext(*b);
  // ...and closes with hostA and hostB once the last call passes.
  std::vector<RoundResult> results = {getWithin(fa), getWithin(fb)};
  checkRound(results, {1, 1});
  CHECK(results[0].hosts == std::vector<std::string>{"hostA", "hostB"});
}

TEST_CASE("c10d factory: the endpoint host embeds the store, a second local agent becomes a "
          "client", "[rendezvous]") {
  // A port the kernel picked, released for the agent's server to bind.
  auto reserved = PortReservation::reserve("127.0.0.1");
  auto o = options(2, 2, "factory");
  o.endpoint.host = "127.0.0.1";
  o.endpoint.port = reserved.port();
  reserved.release();
  CHECK(isLocalEndpoint("127.0.0.1"));
  CHECK(isLocalEndpoint("localhost"));
  CHECK(routeSourceAddress("127.0.0.1", o.endpoint.port) == "127.0.0.1");
  auto host = makeC10dRendezvous(withNode(o, ""));
  auto client = makeC10dRendezvous(withNode(o, ""));  // EADDRINUSE -> client
  auto fh = startNext(*host);
  auto fc = startNext(*client);
  auto rh = getWithin(fh);
  auto rc = getWithin(fc);
  checkRound({rh, rc}, {1, 1});
  CHECK(rh.masterAddr == "127.0.0.1");
  client->leave();
  host->leave();
}

TEST_CASE("c10d factory: is_host=1 with the endpoint port taken is a clear error, not a client of "
          "nobody", "[rendezvous]") {
  auto taken = PortReservation::reserve("127.0.0.1");  // held: nobody serves a store there
  auto o = options(2, 2, "hostclash");
  o.endpoint.host = "127.0.0.1";
  o.endpoint.port = taken.port();
  o.isHost = true;
  CHECK_THROWS_WITH(makeC10dRendezvous(withNode(o, "")),
                    Catch::Contains("is_host=1") && Catch::Contains(std::to_string(taken.port())) &&
                        Catch::Contains("taken"));
}

// The c10d rendezvous: several agents in one process (threads), on MemoryStore and on
// TcpStore + StoreServer over loopback. No sleeps: agents are sequenced through the store
// (watching the round's arrival counter) and results through futures with generous bounds.
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
#include "drun/rendezvous/memory_store.hpp"
#include "drun/rendezvous/port_reservation.hpp"
#include "drun/rendezvous/store_server.hpp"
#include "drun/rendezvous/tcp_store.hpp"
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

TEST_CASE("pickMembers: members of the previous round first, then newcomers, up to MAX",
          "[rendezvous]") {
  auto joiner = [](std::string id, uint64_t arrival, bool rejoining) {
    keys::NodeDescriptor d;
    d.id = std::move(id);
    d.host = d.addr = "h-" + d.id;
    d.arrival = arrival;
    d.rejoining = rejoining;
    return d;
  };
  // A spare (arrived first) and a newcomer wait; three members re-join; MAX 3.
  auto picked = pickMembers({joiner("spare", 0, false), joiner("m1", 1, true),
                             joiner("new", 2, false), joiner("m2", 3, true), joiner("m3", 4, true)},
                            3);
  std::vector<std::string> ids;
  for (const auto& n : picked) ids.push_back(n.id);
  CHECK(ids == std::vector<std::string>{"m1", "m2", "m3"});
  // A member lost: the spare fills its place, ahead of the later newcomer; arrival order kept.
  picked = pickMembers({joiner("spare", 0, false), joiner("m1", 1, true), joiner("new", 2, false),
                        joiner("m3", 4, true)},
                       3);
  ids.clear();
  for (const auto& n : picked) ids.push_back(n.id);
  CHECK(ids == std::vector<std::string>{"spare", "m1", "m3"});
  // The descriptor carries the flag through the store's text form.
  auto line = keys::encodeDescriptor(joiner("m9", 0, true));
  auto parsed = keys::parseJoined(line);
  REQUIRE(parsed.size() == 1);
  CHECK(parsed[0].rejoining);
}

TEST_CASE("failure records and outcomes: encoded, parsed, and corrupt ones refused",
          "[rendezvous]") {
  FailureRecord f;
  f.rank = 7;
  f.localRank = 3;
  f.node = "gpu-01(10.0.0.2)";
  f.signal = 9;
  f.pid = 4242;
  f.timeMs = 1700000000123;
  f.detailSource = "stderr";
  f.detail = "line\twith tab\nsecond line\n";
  f.otherFailures = 2;
  f.final = true;
  auto back = keys::parseFailure(keys::encodeFailure(f));
  CHECK(back.rank == 7);
  CHECK(back.localRank == 3);
  CHECK(back.node == f.node);
  CHECK(back.statusCode() == 137);
  CHECK(back.pid == 4242);
  CHECK(back.timeMs == f.timeMs);
  CHECK(back.detail == f.detail);
  CHECK(back.otherFailures == 2);
  CHECK(back.final);
  CHECK_FALSE(keys::parseOutcome(keys::encodeOutcome(std::nullopt)));
  CHECK(keys::parseOutcome(keys::encodeOutcome(f))->rank == 7);
  // Control characters in a node name cannot break the record's fields.
  f.node = "evil\tname\nx";
  CHECK(keys::parseFailure(keys::encodeFailure(f)).node == "evil name x");
  for (std::string bad : {"", "1\t2\n", "x\t0\t0\t0\t0\t0\t0\t0\tn\t-\n",
                          "0\t0\t0\t999\t0\t0\t0\t0\tn\t-\n", "0\t0\t0\t0\t0\t0\t2\t0\tn\t-\n"})
    CHECK_THROWS_AS(keys::parseFailure(bad), ProtocolError);
  CHECK_THROWS_AS(keys::parseOutcome("maybe"), ProtocolError);
  CHECK_THROWS_AS(keys::parseFailure("0\t0\t0\t0\t0\t0\t0\t0\tn\t-\n" +
                                     std::string(keys::kMaxFailureDetail + 1, 'x')),
                  ProtocolError);
}

TEST_CASE("planRound: node order by host then arrival, prefix sums, requested ranks",
          "[rendezvous]") {
  auto node = [](std::string id, std::string host, int lws, uint64_t arrival,
                 std::optional<int> rank = std::nullopt) {
    keys::NodeDescriptor d;
    d.id = std::move(id);
    d.host = host;
    d.addr = host;
    d.localWorldSize = lws;
    d.arrival = arrival;
    d.requestedRank = rank;
    d.masterPort = static_cast<uint16_t>(1000 + arrival);
    return d;
  };
  auto plan = planRound({node("a", "h2", 2, 0), node("b", "h1", 3, 1), node("c", "h1", 1, 2)});
  CHECK(plan.nodeRank == std::vector<int>{2, 0, 1});  // h1 by arrival, then h2
  CHECK(plan.rankOffset == std::vector<int>{4, 0, 3});
  CHECK(plan.memberAtRank == std::vector<int>{1, 2, 0});
  CHECK(plan.worldSize == 6);
  CHECK(plan.masterAddr == "h1");
  CHECK(plan.masterPort == 1001);

  // Natural host order: node2 before node10.
  auto natural = planRound({node("a", "node10", 1, 0), node("b", "node2", 1, 1),
                            node("c", "node02", 1, 2), node("d", "node1", 1, 3)});
  CHECK(natural.nodeRank == std::vector<int>{3, 1, 2, 0});  // node1 node2 node02 node10

  auto ranked = planRound({node("a", "h1", 1, 0), node("b", "h2", 1, 1, 0)});
  CHECK(ranked.nodeRank == std::vector<int>{1, 0});

  // The same nodes re-forming keep their ranks, whatever the order they come back in: two nodes
  // on one host arrive the other way round this time.
  auto member = [&](std::string id, std::string host, uint64_t arrival, int previous) {
    auto d = node(std::move(id), std::move(host), 1, arrival);
    d.rejoining = true;
    d.previousRank = previous;
    return d;
  };
  auto stable = planRound({member("b", "h1", 0, 1), member("a", "h1", 1, 0), member("c", "h0", 2, 2)});
  CHECK(stable.nodeRank == std::vector<int>{1, 0, 2});
  // A newcomer takes the rank a lost member left free.
  auto replaced = planRound({member("c", "h0", 0, 2), member("a", "h1", 1, 0), node("n", "h9", 1, 2)});
  CHECK(replaced.nodeRank == std::vector<int>{2, 0, 1});
  // The job shrank: a rank out of range now is given up for a free one.
  auto shrunk = planRound({member("c", "h0", 0, 2), member("a", "h1", 1, 0)});
  CHECK(shrunk.nodeRank == std::vector<int>{1, 0});
  // A requested rank wins over a previous one.
  auto requested = planRound({member("a", "h1", 0, 0), node("b", "h2", 1, 1, 0)});
  CHECK(requested.nodeRank == std::vector<int>{1, 0});
  // The previous rank travels in the descriptor; a garbled one makes the line malformed.
  auto parsed = keys::parseJoined(keys::encodeDescriptor(member("x", "h1", 0, 7)));
  REQUIRE(parsed.size() == 1);
  CHECK(parsed[0].rejoining);
  CHECK(parsed[0].previousRank == 7);
  size_t skipped = 0;
  CHECK(keys::parseJoined("x\th\th\t1\t-\t5\tmx\n", &skipped).empty());
  CHECK(skipped == 1);

  auto decided = decideRound("j", 4, {node("a", "h2", 2, 0), node("b", "h1", 3, 1)}, {5, 1});
  REQUIRE(decided.state.ok);
  CHECK(decided.state.roster.size() == 2);
  CHECK(decided.state.roster[0].id == "b");
  CHECK(decided.state.changesAtClose == 5);
  CHECK(decided.state.leftAtClose == 1);
  CHECK(decided.keys == std::vector<std::string>{"rdzv/j/4/assign/a", "rdzv/j/4/assign/b",
                                                 "rdzv/j/4/hosts", "rdzv/j/round",
                                                 "rdzv/j/4/status"});
  CHECK(decided.values[0] == "1\t3");
  CHECK(keys::parseHostList(decided.values[2], 2) == std::vector<std::string>{"h1", "h2"});
  auto header = keys::parseState(decided.values[4]);
  REQUIRE(header);
  CHECK(header->roster.empty());
  CHECK(header->worldSize == 5);
  auto failed = decideRound("j", 0, {node("a", "hostA", 1, 0, 0), node("b", "hostB", 1, 1, 0)}, {});
  CHECK_FALSE(failed.state.ok);
  CHECK_THAT(failed.decision, Catch::StartsWith("error\t"));

  REQUIRE_THROWS_WITH(planRound({node("a", "hostA", 1, 0, 1), node("b", "hostB", 1, 1, 1)}),
                      Catch::Contains("node rank 1 claimed by hostA and hostB"));
  REQUIRE_THROWS_WITH(planRound({node("a", "hostA", 1, 0, 2), node("b", "hostB", 1, 1)}),
                      Catch::Contains("node rank 2 requested by hostA is out of range"));
}

TEST_CASE("keys: descriptors and states round-trip and malformed records are skipped",
          "[rendezvous]") {
  keys::NodeDescriptor d;
  d.id = "1a-ff";
  d.host = "node7";
  d.addr = "10.0.0.7";
  d.localWorldSize = 8;
  d.requestedRank = 3;
  d.masterPort = 4242;
  std::string blob = keys::encodeDescriptor(d) + "garbage\n" + "x\ty\n" + keys::encodeDescriptor(d);
  d.id = "2b";
  d.requestedRank.reset();
  blob += keys::encodeDescriptor(d) + "3c\tpartial";
  size_t skipped = 0;
  auto nodes = keys::parseJoined(blob, &skipped);
  REQUIRE(nodes.size() == 2);
  CHECK(skipped == 3);
  CHECK(nodes[0].id == "1a-ff");
  CHECK(nodes[0].requestedRank == 3);
  CHECK(nodes[0].displayName() == "node7(10.0.0.7)");
  CHECK(nodes[1].id == "2b");
  CHECK_FALSE(nodes[1].requestedRank);
  CHECK(nodes[1].arrival == 1);

  keys::RoundState s;
  s.nodeCount = 2;
  s.worldSize = 16;
  s.masterAddr = "10.0.0.7";
  s.masterPort = 4242;
  s.changesAtClose = 3;
  s.leftAtClose = 2;
  s.roster = {{"n1", "node7(10.0.0.7)", 8}, {"n2", "node8", 8}};
  auto parsed = keys::parseState(keys::encodeState(s));
  REQUIRE(parsed);
  CHECK(parsed->worldSize == 16);
  CHECK(parsed->changesAtClose == 3);
  CHECK(parsed->leftAtClose == 2);
  CHECK(parsed->roster[1].name == "node8");
  CHECK_FALSE(keys::parseState("17"));  // an open round's counter
  CHECK_THROWS_AS(keys::parseState("ok\tbad"), ProtocolError);
  s.worldSize = 17;  // not the sum of the roster
  CHECK_THROWS_AS(keys::parseState(keys::encodeState(s)), ProtocolError);
  CHECK_THROWS_AS(keys::parseAssignment("1"), ProtocolError);
  CHECK_THROWS_AS(keys::validateRunId("a/b"), InvalidArgument);
  d.host = "tab\there";
  CHECK_THROWS_AS(keys::encodeDescriptor(d), InvalidArgument);
}

TEST_CASE("keys: host lists fold numbered runs and round-trip", "[rendezvous]") {
  std::vector<std::string> names;
  for (int i = 0; i < 4096; ++i) names.push_back("node" + std::to_string(i));
  std::string encoded = keys::encodeHostList(names);
  CHECK(encoded.size() < 32);
  CHECK(keys::parseHostList(encoded, names.size()) == names);

  std::vector<std::string> mixed = {"gpu-098.x", "gpu-099.x", "gpu-100.x", "login", "10.0.0.9",
                                    "10.0.0.10", "a7b", "a7b", "box(10.231.0.1)"};
  CHECK(keys::parseHostList(keys::encodeHostList(mixed), mixed.size()) == mixed);
  CHECK(keys::parseHostList(keys::encodeHostList({}), 0).empty());

  CHECK_THROWS_AS(keys::parseHostList(encoded, 4095), ProtocolError);  // one too many
  CHECK_THROWS_AS(keys::parseHostList("~node\t0\t99999999999\t0\t\n", 10), ProtocolError);
  CHECK_THROWS_AS(keys::parseHostList("=a", 1), ProtocolError);  // torn
  CHECK_THROWS_AS(keys::parseHostList("?x\n", 1), ProtocolError);
}

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
  o.port = static_cast<uint16_t>(std::atoi(port));
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

TEST_CASE("decideRound: a negative counter fails the round naming the key", "[rendezvous]") {
  keys::NodeDescriptor n;
  n.id = "n1";
  n.host = "hostA";
  n.addr = "hostA";
  for (RoundCounters counters : {RoundCounters{-1, 0, 0}, RoundCounters{0, -3, 0}}) {
    RoundDecision d = decideRound("job", 4, {n}, counters);
    CHECK_FALSE(d.state.ok);
    CHECK_THAT(d.state.error, Catch::Contains("[rdzv/job/4/changes]") &&
                                  Catch::Contains("[rdzv/job/4/left]"));
    auto parsed = keys::parseState(d.decision);  // readable by every joiner
    REQUIRE(parsed);
    CHECK_FALSE(parsed->ok);
  }
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

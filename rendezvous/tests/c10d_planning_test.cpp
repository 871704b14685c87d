// The c10d rendezvous's pure parts, without agents: which nodes a round takes, its plan (node
// order, ranks), the failure records and key records it stores, and how a round is decided.
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

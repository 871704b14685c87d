// Elastic in place end to end, several resizes in one round (docs/recovery.md "Elastic in
// place"): drun --recovery in-process with recovery_worker (tests/recovery/) on namespace hosts.
// A node a grow took in, lost with a spare waiting, is replaced in the grown world.
// After a shrink renumbered the nodes, a node lost later is recorded and dropped under its new
// node rank and ranks, so the job shrinks again instead of restarting; a grow that a worker's
// death superseded is decided when the newer generation forms, so a node that arrives later is
// taken in by the next grow.
#include <signal.h>

#include <catch2/catch.hpp>
#include <regex>
#include <set>

#include "drun/common/test_skip.hpp"
#include "host_runs.hpp"
#include "launcher_e2e.hpp"
#include "netns.hpp"
#include "process.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

// One --recovery in-process job (--nnodes `nnodes`) of recovery_worker (2 workers a host, 20 ms
// steps) on the hosts of `cluster`, host 0 serving the store; `startAfter` > 0: the workers sleep
// that long before recovery_worker starts (through sh).
RunOptions resizeJobOn(NetnsCluster& cluster, MarkerScope& marker, const std::string& runId, int host,
                       const std::string& conf = "recovery_timeout=2,last_call_timeout=1", int startAfter = 0,
                       const std::string& nnodes = "1:3") {
  std::vector<std::string> argv = {drunPath().string(), "--nnodes", nnodes, "--nproc-per-node", "2", "--rdzv-endpoint",
                                   cluster.address(0) + ":29400", "--rdzv-id", runId, "--max-restarts", "1",
                                   "--recovery", "in-process", "--rdzv-conf", conf,
                                   // node ranks follow names: host i is node rank i of the first round
                                   "--local-addr", cluster.address(host)};
  if (startAfter > 0) argv.insert(argv.end(), {"/bin/sh", "-c", "sleep " + std::to_string(startAfter) + "; exec \"$0\" \"$@\""});
  argv.insert(argv.end(), {helperPath("recovery_worker").string(), "--steps", "900", "--step-ms", "20"});
  RunOptions o;
  o.argv = cluster.exec(host, argv);
  o.env = {marker.env(), "OMP_NUM_THREADS=1"};
  o.timeout = scaled(90s);
  return o;
}

// The pid of rank `rank`'s first "RW start" line in a run's stdout so far (0: none).
long startedPid(const std::string& out, int rank) {
  static const std::regex re(R"(RW start rank=(\d+) local=\d+ pid=(\d+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    if (std::stoi((*it)[1]) == rank) return std::stol((*it)[2]);
  return 0;
}

// The ranks and world sizes of the "RW shrunk" lines of a run's stdout.
std::set<std::pair<int, int>> shrunkTo(const std::string& out) {
  static const std::regex re(R"(RW shrunk rank=(\d+) was=(\d+) world=(\d+) gen=(\d+))");
  std::set<std::pair<int, int>> found;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    found.insert({std::stoi((*it)[1]), std::stoi((*it)[3])});
  return found;
}

}  // namespace

TEST_CASE("recovery: after a shrink renumbered the nodes, a second node lost is dropped under its new node rank "
          "and ranks: the job shrinks again from 4 to 2 ranks, exit 0, no restart", "[multinode]") {
  skipWithoutNetns("multi-node recovery test");
  NetnsCluster cluster(3);
  MarkerScope marker;
  const std::string runId = "resize-" + randomHex(8);
  HostRuns hosts({resizeJobOn(cluster, marker, runId, 0), resizeJobOn(cluster, marker, runId, 1),
                  resizeJobOn(cluster, marker, runId, 2)});
  Process& host0 = hosts[0];
  for (size_t h = 0; h < hosts.size(); ++h) REQUIRE(hosts[h].waitForLines("RW start", 2, scaled(30s)));
  auto runsRank = [](Process& p, int rank) {
    return p.waitForOutput([rank](const std::string& out, const std::string&) { return startedPid(out, rank) > 0; },
                           1s);
  };
  REQUIRE(runsRank(host0, 0));  // host 0 serves the store and the first ranks
  // Node rank 1 (ranks 2 and 3) is lost first; node rank 2 (ranks 4 and 5) is node rank 1 with
  // ranks 2 and 3 of 4 after the shrink, and is lost next.
  const bool oneFirst = runsRank(hosts[1], 2);
  const size_t first = oneFirst ? 1 : 2, second = oneFirst ? 2 : 1;
  REQUIRE(runsRank(hosts[second], 4));
  hosts.kill(first);
  if (!hosts[second].waitForOutput(
          [](const std::string&, const std::string& err) { return contains(err, "generation 2 formed"); }, scaled(30s))) {
    INFO(hosts.describe());
    FAIL("the survivors did not shrink in place");
  }
  hosts.kill(second);
  const RunResult r = hosts.wait(0);
  INFO(hosts.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  CHECK(contains(r.err, "the job shrinks in place from 6 to 4 ranks (3 to 2 nodes): generation 2"));
  CHECK(contains(r.err, "(ranks 2, 3) was lost and no spare took its place; the job shrinks in place from 4 to 2 "
                        "ranks (2 to 1 nodes): generation 4"));
  CHECK_FALSE(contains(r.err, "restarting the job"));
  CHECK_FALSE(contains(r.err, "re-forming the job"));
  CHECK(shrunkTo(r.out) == std::set<std::pair<int, int>>{{0, 4}, {1, 4}, {0, 2}, {1, 2}});
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("recovery: a grow superseded by a worker's death is decided when the newer generation forms: a node "
          "that arrives later is taken in by the next grow", "[multinode]") {
  skipWithoutNetns("multi-node recovery test");
  NetnsCluster cluster(3);
  MarkerScope marker;
  const std::string runId = "regrow-" + randomHex(8);
  const std::string conf = "recovery_timeout=20,last_call_timeout=1";
  HostRuns hosts({resizeJobOn(cluster, marker, runId, 0, conf)});
  Process& host0 = hosts[0];
  REQUIRE(host0.waitForLines("RW start", 2, scaled(30s)));
  // Host 1 is taken in by a grow (generation 1), its workers slow to start: the grow stays open.
  hosts.start(resizeJobOn(cluster, marker, runId, 1, conf, 4));
  auto saidOn0 = [&](const std::string& what) {
    return host0.waitForOutput([&](const std::string&, const std::string& err) { return contains(err, what); },
                               scaled(30s));
  };
  REQUIRE(saidOn0("a node joins the running job in place: world 2 -> 4 ranks (1 -> 2 nodes), generation 1"));
  long pid = 0;
  REQUIRE(host0.waitForOutput([&](const std::string& out, const std::string&) { return (pid = startedPid(out, 1)) > 0; },
                              scaled(5s)));
  ::kill(static_cast<pid_t>(pid), SIGKILL);  // generation 2 supersedes the grow
  if (!saidOn0("generation 2 formed")) {
    INFO(hosts.describe());
    FAIL("generation 2 did not form");
  }
  // The next node is taken in by a grow of its own.
  hosts.start(resizeJobOn(cluster, marker, runId, 2, conf));
  const RunResult third = hosts.wait(2);
  const RunResult second = hosts.wait(1);
  const RunResult first = hosts.wait(0);
  INFO(hosts.describe());
  for (const RunResult* r : {&first, &second, &third}) {
    INFO("host " << (r == &first ? 0 : r == &second ? 1 : 2));
    REQUIRE_FALSE(r->timedOut);
    CHECK(r->status() == 0);
    CHECK_FALSE(contains(r->err, "restarting the job"));
    CHECK_FALSE(contains(r->err, "re-forming the job"));
  }
  CHECK(contains(third.err, "taking a place it grows by in the running job"));
  CHECK(contains(first.err, "a node joins the running job in place: world 4 -> 6 ranks (2 -> 3 nodes), generation 3"));
  CHECK(contains(first.err, "generation 3 formed"));
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("recovery: a node a grow took in, lost with a spare waiting, is replaced in the grown world: the spare's "
          "workers are ranks 2 and 3 of 4, no shrink, exit 0", "[multinode]") {
  skipWithoutNetns("multi-node recovery test");
  NetnsCluster cluster(3);
  MarkerScope marker;
  const std::string runId = "spare-grown-" + randomHex(8);
  const std::string conf = "recovery_timeout=20,last_call_timeout=1";
  auto job = [&](int host) { return resizeJobOn(cluster, marker, runId, host, conf, 0, "1:2"); };
  HostRuns hosts({job(0)});
  REQUIRE(hosts[0].waitForLines("RW start", 2, scaled(30s)));
  hosts.start(job(1));  // taken in by a grow: generation 1, 2 nodes, the job's MAX
  REQUIRE(hosts[0].waitForOutput([](const std::string&, const std::string& err) { return contains(err, "generation 1 formed"); },
                                 scaled(30s)));
  const size_t spare = hosts.start(job(2), "spare (host 2)");  // beyond MAX
  REQUIRE(hosts[spare].waitForOutput([](const std::string&, const std::string& err) { return contains(err, "spare"); },
                                     scaled(30s)));
  hosts.kill(1);
  const RunResult took = hosts.wait(spare);
  const RunResult first = hosts.wait(0);
  INFO(hosts.describe());
  for (const RunResult* r : {&first, &took}) {
    INFO((r == &first ? "host 0" : "the spare"));
    REQUIRE_FALSE(r->timedOut);
    CHECK(r->status() == 0);
    CHECK_FALSE(contains(r->err, "restarting the job"));
    CHECK_FALSE(contains(r->err, "re-forming the job"));
    CHECK_FALSE(contains(r->err, "shrinks in place"));
    CHECK(contains(r->out, "world=4"));
    CHECK_FALSE(contains(r->out, "world=2"));
  }
  CHECK(contains(took.err, "taking a lost node's place in the running job"));
  CHECK(startedPid(took.out, 2) > 0);
  CHECK(startedPid(took.out, 3) > 0);
  CHECK(contains(took.out, "gen=2"));
  CHECK(marker.leftovers(5s).empty());
}

// In-process recovery end to end when a node is lost (docs/recovery.md "A lost node", "Elastic in
// place"): drun --recovery in-process with recovery_worker (tests/recovery/) on network-namespace
// hosts, one of them SIGKILLed. A spare takes the lost node's node rank and ranks while the other
// hosts' workers keep running; with no spare the survivors shrink in place, renumbered, and a node
// that comes back grows the job again. Through tests/recovery/standby_exec.py (a Python program
// that imports drun, then runs recovery_worker) the nodes have standby workers: a spare's take the
// lost node's ranks.
#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <thread>

#include "drun/common/test_skip.hpp"
#include "event_lines.hpp"
#include "host_runs.hpp"
#include "launcher_e2e.hpp"
#include "netns.hpp"
#include "process.hpp"
#include "recovery_lines.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

// drun --recovery in-process with recovery_worker on the hosts of a namespace cluster of its own
// (host 0 serves the store): the options of one job, and a process of it on a host.
struct NamespaceJob {
  NetnsCluster cluster;
  MarkerScope marker;
  std::vector<std::string> args;

  NamespaceJob(int hosts, const std::string& nnodes, const std::string& conf, int steps) : cluster(hosts) {
    args = {drunPath().string(), "--nnodes", nnodes, "--nproc-per-node", "2", "--rdzv-endpoint",
            cluster.address(0) + ":29400", "--rdzv-id", "node-" + randomHex(8), "--max-restarts", "1",
            "--recovery", "in-process", "--rdzv-conf", conf, helperPath("recovery_worker").string(),
            "--steps", std::to_string(steps), "--step-ms", "20"};
  }
  // The workers run through tests/recovery/standby_exec.py (a Python program: standby workers),
  // and `host`'s events go to `events`.
  RunOptions throughPython(int host, const std::filesystem::path& events) const {
    std::vector<std::string> a = args;
    const auto program = std::find(a.begin(), a.end(), helperPath("recovery_worker").string());
    a.insert(program, {"--events", events.string(), "/usr/bin/python3",
                                 (std::filesystem::path(DRUN_SOURCE_DIR) / "tests" / "recovery" / "standby_exec.py").string()});
    RunOptions o = on(host);
    o.argv = cluster.exec(host, a);
    return o;
  }
  RunOptions on(int host) const {
    RunOptions o;
    o.argv = cluster.exec(host, args);
    o.env = {marker.env(), "OMP_NUM_THREADS=1"};
    o.timeout = scaled(90s);
    return o;
  }
};

// Each host's two workers started (a host is lost by SIGKILL: its workers die with it, by the
// parent-death signal); on failure, every host's output.
void requireWorkersStarted(HostRuns& hosts) {
  for (size_t h = 0; h < hosts.size(); ++h)
    if (!hosts[h].waitForLines("RW start", 2, scaled(30s))) {
      INFO(hosts.describe());
      FAIL("host " << h << "'s workers did not start");
    }
}

// Waits until the host's stderr says `what`; on failure, every host's output.
void requireSaid(HostRuns& hosts, size_t host, const std::string& what) {
  if (hosts[host].waitForOutput([&](const std::string&, const std::string& err) { return contains(err, what); },
                                scaled(30s)))
    return;
  INFO(hosts.describe());
  FAIL("host " << host << " did not say \"" << what << "\"");
}

// The survivor and the spare that took the lost node's place: generation 1 formed, nothing
// re-formed or restarted, exit 0.
void checkRecoveredInPlace(const std::vector<RunResult>& runs) {
  for (const RunResult& r : runs) {
    INFO("run " << &r - runs.data() << " of those checked");
    REQUIRE_FALSE(r.timedOut);
    CHECK(r.status() == 0);
    CHECK_FALSE(contains(r.err, "re-forming the job"));
    CHECK_FALSE(contains(r.err, "restarting the job"));
    CHECK(contains(r.err, "generation 1 formed"));
  }
}

}  // namespace

TEST_CASE("recovery: a member node SIGKILLed is replaced by a spare that takes its node rank and ranks "
          "while the other host's workers keep running", "[multinode]") {
  skipWithoutNetns("multi-node recovery test");
  // host 0 serves the store (the endpoint); host 1 is lost; host 2 arrives once the job runs with
  // its MAX of 2 nodes: a spare.
  NamespaceJob job(3, "2", "recovery_timeout=30", 400);
  HostRuns hosts({job.on(0), job.on(1)});
  requireWorkersStarted(hosts);
  const size_t spare = hosts.start(job.on(2), "spare (host 2)");
  requireSaid(hosts, spare, "spare");
  const RunResult lost = hosts.kill(1);
  const std::vector<RunResult> runs = {hosts.wait(0), hosts.wait(spare)};
  INFO(hosts.describe());
  checkRecoveredInPlace(runs);
  CHECK(contains(runs[0].err, "was lost; the other nodes' workers go on, and its place is offered to a spare: "
                              "generation 1 (restart 1 of 1)"));
  CHECK(contains(runs[1].err, "taking a lost node's place in the running job"));
  // Host 0's workers kept their processes; the spare's took the lost node's ranks in generation 1.
  std::map<int, std::vector<Start>> kept, took, gone;
  for (const Start& s : starts(runs[0].out)) kept[s.rank].push_back(s);
  for (const Start& s : starts(runs[1].out)) took[s.rank].push_back(s);
  for (const Start& s : starts(lost.out)) gone[s.rank].push_back(s);
  REQUIRE(kept.size() == 2);
  REQUIRE(took.size() == 2);
  for (auto& [rank, s] : kept) {
    REQUIRE(s.size() == 1);
    CHECK(donePids(runs[0].out)[rank] == s[0].pid);
  }
  for (auto& [rank, s] : took) {
    CHECK(gone.count(rank) == 1);  // the lost node's ranks
    CHECK(kept.count(rank) == 0);
    REQUIRE(s.size() == 1);
    CHECK(s[0].gen == 1);
    CHECK(s[0].restart == 1);
    CHECK(donePids(runs[1].out)[rank] == s[0].pid);
  }
  CHECK(job.marker.leftovers(5s).empty());
}

// The survivors' side of a shrink: each of `run`'s workers started once, finished in that
// process, and was renumbered into the smaller world of `world` ranks; returns their new ranks.
std::set<int> checkShrunkInPlace(const RunResult& run, int world) {
  static const std::regex shrunk(R"(RW shrunk rank=(\d+) was=(\d+) world=(\d+) gen=(\d+))");
  std::set<int> now;
  const auto started = starts(run.out);
  for (auto it = std::sregex_iterator(run.out.begin(), run.out.end(), shrunk); it != std::sregex_iterator(); ++it) {
    CHECK(std::stoi((*it)[3]) == world);
    now.insert(std::stoi((*it)[1]));
  }
  CHECK(now.size() == started.size());
  const auto done = donePids(run.out);
  for (const Start& s : started) CHECK(std::any_of(done.begin(), done.end(), [&](auto& d) { return d.second == s.pid; }));
  for (const auto& [rank, pid] : done) CHECK(now.count(rank) == 1);
  CHECK(contains(run.out, "world=" + std::to_string(world)));
  return now;
}

// A survivor of the 2:3 job that lost one of its three nodes: exit 0, shrunk from 6 to 4 ranks in
// place, no restart, its two workers the same processes throughout; returns their ranks after the
// shrink.
std::set<int> checkSurvivorOfThree(const RunResult& r, size_t host) {
  INFO("host " << host);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  CHECK(contains(r.err, "the job shrinks in place from 6 to 4 ranks (3 to 2 nodes)"));
  CHECK_FALSE(contains(r.err, "restarting the job"));
  REQUIRE(starts(r.out).size() == 2);
  return checkShrunkInPlace(r, 4);
}

// Under --recovery restart this job re-formed without the lost node; in place it shrinks.
TEST_CASE("recovery: a member node SIGKILLed with no spare to take its place: the survivor shrinks in place "
          "after recovery_timeout, its workers renumbered, and every node says why", "[multinode]") {
  skipWithoutNetns("multi-node recovery test");
  TempDir dir;
  const auto events = dir / "events.jsonl";
  NamespaceJob job(2, "1:2", "recovery_timeout=2,last_call_timeout=1", 300);
  RunOptions first = job.on(0);  // its events to `events`: the option right after drun's path
  first.argv.insert(std::find(first.argv.begin(), first.argv.end(), drunPath().string()) + 1,
                    {"--events", events.string()});
  HostRuns hosts({first, job.on(1)});
  requireWorkersStarted(hosts);
  hosts.kill(1);
  const RunResult r = hosts.wait(0);
  INFO(hosts.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  CHECK(contains(r.err, "its place is offered to a spare: generation 1"));
  // The claimer's offer says the recovery once: no "rank 2 on ... failed" line for it besides.
  CHECK_FALSE(contains(r.err, "the job recovers in place: generation 1"));
  CHECK(contains(r.err, "was lost and no spare took its place; the job shrinks in place from 4 to 2 ranks "
                        "(2 to 1 nodes): generation 2"));
  CHECK(contains(r.err, "generation 2 formed"));
  CHECK_FALSE(contains(r.err, "restarting the job"));
  // No restart: the two workers kept their processes, now ranks 0 and 1 of 2.
  const auto started = starts(r.out);
  REQUIRE(started.size() == 2);
  CHECK(checkShrunkInPlace(r, 2) == std::set<int>{0, 1});
  const auto shrunk = eventsOf(events, "recovery_shrunk");
  REQUIRE(shrunk.size() == 1);
  CHECK(contains(shrunk[0], "\"world_size_before\":4"));
  CHECK(contains(shrunk[0], "\"world_size\":2"));
  CHECK(contains(shrunk[0], "\"node_count\":1"));
  CHECK(contains(shrunk[0], "\"rank_offset\":0"));
  CHECK(eventsOf(events, "recovery_fallback").empty());
  CHECK(eventsOf(events, "round_formed").size() == 1);  // one round: nothing restarted
  CHECK(job.marker.leftovers(5s).empty());
}

TEST_CASE("recovery: one of three nodes SIGKILLed, no spare: the two others shrink in place, worker pids "
          "unchanged, ranks renumbered densely, exit 0", "[multinode]") {
  skipWithoutNetns("multi-node recovery test");
  NamespaceJob job(3, "2:3", "recovery_timeout=2,last_call_timeout=1", 300);
  HostRuns hosts({job.on(0), job.on(1), job.on(2)});
  requireWorkersStarted(hosts);
  hosts.kill(1);
  const std::vector<RunResult> runs = hosts.waitAll();
  INFO(hosts.describe());
  std::set<int> ranks;
  for (size_t h : {0, 2})
    for (int rank : checkSurvivorOfThree(runs[h], h)) ranks.insert(rank);
  CHECK(ranks == std::set<int>{0, 1, 2, 3});
  CHECK(job.marker.leftovers(5s).empty());
}

TEST_CASE("recovery: one of three nodes SIGKILLed, the two others shrink in place, then its agent started again "
          "is taken in at a commit: the job grows back to 6 ranks, worker pids unchanged, exit 0", "[multinode]") {
  skipWithoutNetns("multi-node recovery test");
  NamespaceJob job(3, "2:3", "recovery_timeout=2,last_call_timeout=1", 600);
  HostRuns hosts({job.on(0), job.on(1), job.on(2)});
  requireWorkersStarted(hosts);
  hosts.kill(1);
  requireSaid(hosts, 0, "generation 2 formed");  // the survivors shrank in place
  const size_t host1 = hosts.start(job.on(1), "host 1, back");  // the job runs below MAX: taken in
  const RunResult back = hosts.wait(host1);
  const std::vector<RunResult> runs = hosts.waitAll();
  INFO(hosts.describe());
  REQUIRE_FALSE(back.timedOut);
  CHECK(back.status() == 0);
  CHECK(contains(back.err, "taking a place it grows by in the running job"));
  std::set<int> grownRanks;
  for (const Start& s : starts(back.out)) {
    CHECK(s.gen == 3);
    CHECK(s.restart <= 1);  // the grow spends no unit of --max-restarts
    grownRanks.insert(s.rank);
  }
  CHECK(grownRanks == std::set<int>{4, 5});
  std::set<int> ranks;
  for (size_t h : {0, 2}) {
    const RunResult& r = runs[h];
    for (int rank : checkSurvivorOfThree(r, h)) ranks.insert(rank);  // ranks kept by the grow
    CHECK(contains(r.err, "a node joins the running job in place: world 4 -> 6 ranks (2 -> 3 nodes), generation 3"));
    CHECK(contains(r.err, "generation 3 formed: the job runs with 6 ranks on 3 nodes"));
    CHECK_FALSE(contains(r.err, "re-forming the job"));
    CHECK(contains(r.out, "RW grown"));
  }
  CHECK(ranks == std::set<int>{0, 1, 2, 3});
  CHECK(job.marker.leftovers(5s).empty());
}

TEST_CASE("recovery: a spare keeps a standby worker per local rank while it waits: the lost node's ranks go "
          "to them when it takes the place, and they end with the job when it takes none", "[multinode]") {
  skipWithoutNetns("multi-node recovery test");
  TempDir dir;
  NamespaceJob job(3, "2", "recovery_timeout=30", 300);
  HostRuns hosts({job.throughPython(0, dir / "host0.jsonl"), job.throughPython(1, dir / "host1.jsonl")});
  requireWorkersStarted(hosts);
  const size_t spare = hosts.start(job.throughPython(2, dir / "spare.jsonl"), "spare (host 2)");
  REQUIRE(hosts[spare].waitForLines("SE importing", 2, scaled(30s)));  // its two standbys
  std::map<long, int> standbySlots;  // pid -> slot, of the standbys the spare kept while waiting
  auto readStandbys = [&](const std::vector<nlohmann::json>& events) {
    for (const auto& e : ofKind(events, "standby_started"))
      if (e.value("spare", false)) standbySlots[e["pid"].get<long>()] = e["slot"].get<int>();
  };

  SECTION("the lost node's ranks go to the standbys") {
    std::this_thread::sleep_for(scaled(1s));  // ... waiting in `import drun`
    const RunResult lost = hosts.kill(1);
    const std::vector<RunResult> runs = {hosts.wait(0), hosts.wait(spare)};
    INFO(hosts.describe());
    checkRecoveredInPlace(runs);
    const auto events = readEvents(dir / "spare.jsonl");
    readStandbys(events);
    CHECK(standbySlots.size() == 2);
    // Each of the lost node's ranks went to one of them, in generation 1: its "RW start" pid too.
    std::map<int, long> took;
    for (const Start& s : starts(runs[1].out)) took[s.rank] = s.pid;
    const auto started = ofKind(events, "worker_started");
    REQUIRE(started.size() == 2);
    std::set<long> pids;
    for (const auto& e : started) {
      INFO(e.dump());
      CHECK(e.value("standby", false));
      CHECK(e.value("generation", 0) == 1);
      const long pid = e["pid"].get<long>();
      CHECK(standbySlots.count(pid) == 1);
      CHECK(took[e["rank"].get<int>()] == pid);
      pids.insert(pid);
    }
    CHECK(pids.size() == 2);
    for (const Start& s : starts(lost.out)) CHECK(took.count(s.rank) == 1);  // the lost node's ranks
  }
  SECTION("no place: the job ends, and the spare's standbys with it") {
    const std::vector<RunResult> runs = hosts.waitAll();
    INFO(hosts.describe());
    for (const RunResult& r : runs) {
      REQUIRE_FALSE(r.timedOut);
      CHECK(r.status() == 0);
    }
    const auto events = readEvents(dir / "spare.jsonl");
    readStandbys(events);
    CHECK(standbySlots.size() == 2);
    CHECK(ofKind(events, "worker_started").empty());
  }
  CHECK(job.marker.leftovers(5s).empty());  // no standby outlives the job
}

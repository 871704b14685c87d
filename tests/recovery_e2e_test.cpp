// In-process recovery end to end (docs/recovery.md): drun --recovery in-process with
// recovery_worker (tests/recovery/), which plays the workers' side of a recovery over the
// workers' store without libdrun_comm: a dead worker is replaced by a process with the same ranks
// while the others keep theirs, the budget and the restart count are the job's, survivors that
// never join fall back to a restart that says why, and a recovery on one namespace host leaves
// the other host's workers running. Through tests/recovery/standby_exec.py (a Python program that
// imports drun, then runs recovery_worker) the nodes have standby workers: a spare's take the
// lost node's ranks.
#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "drun/common/test_skip.hpp"
#include "event_lines.hpp"
#include "launcher_e2e.hpp"
#include "netns.hpp"
#include "process.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

struct Start {
  int rank, local, gen, restart;
  long pid;
};

// The "RW start" lines of a run's stdout, in order.
std::vector<Start> starts(const std::string& out) {
  static const std::regex re(R"(RW start rank=(\d+) local=(\d+) pid=(\d+) gen=(\d+) restart=(\d+))");
  std::vector<Start> found;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    found.push_back({std::stoi((*it)[1]), std::stoi((*it)[2]), std::stoi((*it)[4]), std::stoi((*it)[5]),
                     std::stol((*it)[3])});
  return found;
}

// rank -> pid of its "RW done" line.
std::map<int, long> donePids(const std::string& out) {
  static const std::regex re(R"(RW done rank=(\d+) pid=(\d+))");
  std::map<int, long> done;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    done[std::stoi((*it)[1])] = std::stol((*it)[2]);
  return done;
}

std::vector<std::string> recoveryWorker(std::vector<std::string> args) {
  args.insert(args.begin(), helperPath("recovery_worker").string());
  return args;
}

// The event lines of `kind` in an --events file.
std::vector<std::string> eventsOf(const std::filesystem::path& file, const std::string& kind) {
  std::vector<std::string> out;
  for (const std::string& line : splitLines(slurp(file)))
    if (contains(line, "\"event\":\"" + kind + "\"")) out.push_back(line);
  return out;
}

}  // namespace

TEST_CASE("recovery: a dead worker is replaced with the same RANK and LOCAL_RANK while the others keep "
          "their processes", "[e2e]") {
  MarkerScope marker;
  TempDir dir;
  const auto events = dir / "events.jsonl";
  auto r = run(drunCommand(concat({"--nproc-per-node", "3", "--max-restarts", "2", "--recovery", "in-process",
                                   "--events", events.string()},
                                  recoveryWorker({"--die", "1:5", "--steps", "60"})),
                           {marker.env()}, scaled(30s)));
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  const auto started = starts(r.out);
  std::map<int, std::vector<Start>> byRank;
  for (const Start& s : started) byRank[s.rank].push_back(s);
  REQUIRE(byRank.size() == 3);
  CHECK(byRank[0].size() == 1);
  CHECK(byRank[2].size() == 1);
  REQUIRE(byRank[1].size() == 2);
  const Start& replacement = byRank[1][1];
  CHECK(replacement.local == 1);
  CHECK(replacement.gen == 1);
  CHECK(replacement.restart == 1);  // TORCHELASTIC_RESTART_COUNT includes its own recovery
  CHECK(replacement.pid != byRank[1][0].pid);
  // The survivors finished in the processes they started in; rank 1 in its replacement.
  const auto done = donePids(r.out);
  CHECK(done.at(0) == byRank[0][0].pid);
  CHECK(done.at(2) == byRank[2][0].pid);
  CHECK(done.at(1) == replacement.pid);
  CHECK(contains(r.err, "failed (exit code 3); replacing it in place: generation 1 (restart 1 of 2)"));
  CHECK(contains(r.err, "generation 1 formed"));
  CHECK_FALSE(contains(r.err, "restarting the job"));
  const auto began = eventsOf(events, "recovery_started");
  REQUIRE(began.size() == 1);
  CHECK(contains(began[0], "\"generation\":1"));
  CHECK(contains(began[0], "\"restart_count\":1"));
  CHECK(contains(began[0], "\"rank\":1"));
  const auto formed = eventsOf(events, "recovery_formed");
  REQUIRE(formed.size() == 1);
  CHECK(std::regex_search(formed[0], std::regex(R"("ms":\d+)")));
  CHECK(eventsOf(events, "recovery_fallback").empty());
  CHECK(eventsOf(events, "round_formed").size() == 1);  // one round: nothing restarted
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("recovery: survivors that never join fall back to a restart at recovery_timeout, saying why",
          "[e2e]") {
  MarkerScope marker;
  TempDir dir;
  const auto events = dir / "events.jsonl";
  auto r = run(drunCommand(concat({"--nproc-per-node", "3", "--max-restarts", "2", "--recovery", "in-process",
                                   "--rdzv-conf", "recovery_timeout=1", "--events", events.string()},
                                  recoveryWorker({"--die", "1:5", "--steps", "80", "--never-join"})),
                           {marker.env()}, scaled(40s)));
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  CHECK(contains(r.err, "drun: generation 1 did not form: the survivors never joined the recovery; "
                        "restarting the job"));
  // The fallback's restart is paid by the recovery's unit: restart 1, not 2.
  CHECK(contains(r.err, "restarting the job (restart 1 of 2)"));
  int restarted = 0;
  for (const Start& s : starts(r.out)) restarted += s.restart == 1 && s.gen == 0;
  CHECK(restarted == 3);  // the whole job again, each with TORCHELASTIC_RESTART_COUNT=1
  const auto fallback = eventsOf(events, "recovery_fallback");
  REQUIRE(fallback.size() == 1);
  CHECK(contains(fallback[0], "the survivors never joined the recovery"));
  CHECK(eventsOf(events, "round_formed").size() == 2);
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("recovery: a worker that dies with the budget spent ends the job with its root cause", "[e2e]") {
  MarkerScope marker;
  auto r = run(drunCommand(concat({"--nproc-per-node", "2", "--recovery", "in-process"},
                                  recoveryWorker({"--die", "0:3", "--steps", "200"})),
                           {marker.env()}, scaled(30s)));
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 3);
  CHECK(contains(r.err, "no in-process recovery: the job's restart budget (--max-restarts 0) is spent"));
  expectRootCause(r, rootCause(0, "exited with code 3"));
  CHECK(starts(r.out).size() == 2);  // nothing replaced
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("bad input: --recovery, PET_RECOVERY and recovery_timeout take only what they mean", "[e2e]") {
  struct Bad {
    std::vector<std::string> args, env, keywords;
  };
  for (const Bad& bad : {Bad{{"--recovery", "bogus"}, {}, {"--recovery", "bogus"}},
                         Bad{{}, {"PET_RECOVERY=in_process"}, {"--recovery", "in_process"}},
                         Bad{{"--recovery", "in-process", "--rdzv-conf", "recovery_timeout=soon"}, {}, {"recovery_timeout"}},
                         Bad{{"--recovery", "in-process", "--nnodes", "2", "--node-rank", "0"}, {}, {"c10d"}}}) {
    DYNAMIC_SECTION(bad.keywords.back()) {
      MarkerScope marker;
      TempDir started;
      std::vector<std::string> env = bad.env;
      env.push_back(marker.env());
      auto r = run(drunCommand(concat(bad.args, touchProgram(started)), env));
      expectUsageError(r, bad.keywords, started, marker);
    }
  }
}

TEST_CASE("recovery: a worker dying on one namespace host is replaced there while the other host's "
          "workers keep running", "[multinode]") {
  skipWithoutNetns("multi-node recovery test");
  NetnsCluster cluster(2);
  MarkerScope marker;
  const std::vector<std::string> args = {
      drunPath().string(), "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint",
      cluster.address(0) + ":29400", "--rdzv-id", "rec-" + randomHex(8), "--max-restarts", "1",
      "--recovery", "in-process", helperPath("recovery_worker").string(), "--die", "3:10", "--steps", "80"};
  auto on = [&](int host) {
    RunOptions o;
    o.argv = cluster.exec(host, args);
    o.env = {marker.env(), "OMP_NUM_THREADS=1"};
    o.timeout = scaled(60s);
    return o;
  };
  Process host0(on(0));
  Process host1(on(1));
  std::vector<RunResult> runs = {host0.wait(), host1.wait()};
  std::map<int, std::vector<Start>> byRank;
  std::map<int, long> done;
  int replacedOn = -1;
  for (size_t h = 0; h < runs.size(); ++h) {
    INFO(runs[h].describe());
    REQUIRE_FALSE(runs[h].timedOut);
    CHECK(runs[h].status() == 0);
    for (const Start& s : starts(runs[h].out)) byRank[s.rank].push_back(s);
    for (auto [rank, pid] : donePids(runs[h].out)) done[rank] = pid;
    if (contains(runs[h].err, "replacing it in place: generation 1 (restart 1 of 1)")) replacedOn = static_cast<int>(h);
    CHECK(contains(runs[h].err, "generation 1 formed"));
    CHECK_FALSE(contains(runs[h].err, "restarting the job"));
    CHECK_FALSE(contains(runs[h].err, "lost the workers' store"));  // the store closing at a clean end
  }
  REQUIRE(replacedOn >= 0);
  // The other host heard of it and kept its workers.
  CHECK(contains(runs[1 - replacedOn].err, "rank 3 on"));
  CHECK(contains(runs[1 - replacedOn].err, "the job recovers in place: generation 1 (restart 1 of 1)"));
  REQUIRE(byRank.size() == 4);
  for (int rank : {0, 1, 2}) {
    REQUIRE(byRank[rank].size() == 1);
    CHECK(done[rank] == byRank[rank][0].pid);
  }
  REQUIRE(byRank[3].size() == 2);
  CHECK(byRank[3][1].gen == 1);
  CHECK(byRank[3][1].restart == 1);
  CHECK(done[3] == byRank[3][1].pid);
  CHECK(marker.leftovers(5s).empty());
}

namespace {

// drun --recovery in-process with recovery_worker on the hosts of a namespace cluster (host 0
// serves the store): the options of one job, and a process of it on a host.
struct NamespaceJob {
  NetnsCluster& cluster;
  MarkerScope& marker;
  std::vector<std::string> args;

  NamespaceJob(NetnsCluster& c, MarkerScope& m, const std::string& nnodes, const std::string& conf, int steps)
      : cluster(c), marker(m) {
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

// The survivor and the spare that took the lost node's place: generation 1 formed, nothing
// re-formed or restarted, exit 0.
void checkRecoveredInPlace(const std::vector<RunResult>& runs) {
  for (const RunResult& r : runs) {
    INFO(r.describe());
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
  NetnsCluster cluster(3);
  MarkerScope marker;
  // host 0 serves the store (the endpoint); host 1 is lost; host 2 arrives once the job runs with
  // its MAX of 2 nodes: a spare.
  const NamespaceJob job(cluster, marker, "2", "recovery_timeout=30", 400);
  Process host0(job.on(0));
  Process host1(job.on(1));
  REQUIRE(host0.waitForLines("RW start", 2, scaled(30s)));
  REQUIRE(host1.waitForLines("RW start", 2, scaled(30s)));
  Process spare(job.on(2));
  REQUIRE(spare.waitForOutput([](const std::string&, const std::string& err) { return contains(err, "spare"); },
                              scaled(30s)));
  host1.signal(SIGKILL);  // its workers die with it (parent-death signal)
  const RunResult lost = host1.wait();
  const std::vector<RunResult> runs = {host0.wait(), spare.wait()};
  checkRecoveredInPlace(runs);
  INFO(runs[0].describe());
  INFO(runs[1].describe());
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
  CHECK(marker.leftovers(5s).empty());
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
std::set<int> checkSurvivorOfThree(const RunResult& r) {
  INFO(r.describe());
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
  NetnsCluster cluster(2);
  MarkerScope marker;
  TempDir dir;
  const auto events = dir / "events.jsonl";
  const NamespaceJob job(cluster, marker, "1:2", "recovery_timeout=2,last_call_timeout=1", 300);
  RunOptions first = job.on(0);  // its events to `events`: the option right after drun's path
  first.argv.insert(std::find(first.argv.begin(), first.argv.end(), drunPath().string()) + 1,
                    {"--events", events.string()});
  Process host0(first);
  Process host1(job.on(1));
  REQUIRE(host0.waitForLines("RW start", 2, scaled(30s)));
  REQUIRE(host1.waitForLines("RW start", 2, scaled(30s)));
  host1.signal(SIGKILL);
  host1.wait();
  const RunResult r = host0.wait();
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  CHECK(contains(r.err, "its place is offered to a spare: generation 1"));
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
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("recovery: one of three nodes SIGKILLed, no spare: the two others shrink in place, worker pids "
          "unchanged, ranks renumbered densely, exit 0", "[multinode]") {
  skipWithoutNetns("multi-node recovery test");
  NetnsCluster cluster(3);
  MarkerScope marker;
  const NamespaceJob job(cluster, marker, "2:3", "recovery_timeout=2,last_call_timeout=1", 300);
  Process host0(job.on(0));
  Process host1(job.on(1));
  Process host2(job.on(2));
  for (Process* p : {&host0, &host1, &host2}) REQUIRE(p->waitForLines("RW start", 2, scaled(30s)));
  host1.signal(SIGKILL);
  host1.wait();
  std::set<int> ranks;
  for (Process* p : {&host0, &host2})
    for (int rank : checkSurvivorOfThree(p->wait())) ranks.insert(rank);
  CHECK(ranks == std::set<int>{0, 1, 2, 3});
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("recovery: one of three nodes SIGKILLed, the two others shrink in place, then its agent started again "
          "is taken in at a commit: the job grows back to 6 ranks, worker pids unchanged, exit 0", "[multinode]") {
  skipWithoutNetns("multi-node recovery test");
  NetnsCluster cluster(3);
  MarkerScope marker;
  const NamespaceJob job(cluster, marker, "2:3", "recovery_timeout=2,last_call_timeout=1", 600);
  Process host0(job.on(0));
  auto host1 = std::make_unique<Process>(job.on(1));
  Process host2(job.on(2));
  for (Process* p : {&host0, host1.get(), &host2}) REQUIRE(p->waitForLines("RW start", 2, scaled(30s)));
  host1->signal(SIGKILL);
  host1->wait();
  if (!host0.waitForOutput([](const std::string&, const std::string& err) { return contains(err, "generation 2 formed"); },
                           scaled(30s))) {
    INFO(host0.wait().describe());
    FAIL("the survivors did not shrink in place");
  }
  host1 = std::make_unique<Process>(job.on(1));  // back: the job runs below MAX, so it is taken in
  const RunResult back = host1->wait();
  INFO(back.describe());
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
  for (Process* p : {&host0, &host2}) {
    const RunResult r = p->wait();
    for (int rank : checkSurvivorOfThree(r)) ranks.insert(rank);  // ranks kept by the grow
    INFO(r.describe());
    CHECK(contains(r.err, "a node joins the running job in place: world 4 -> 6 ranks (2 -> 3 nodes), generation 3"));
    CHECK(contains(r.err, "generation 3 formed: the job runs with 6 ranks on 3 nodes"));
    CHECK_FALSE(contains(r.err, "re-forming the job"));
    CHECK(contains(r.out, "RW grown"));
  }
  CHECK(ranks == std::set<int>{0, 1, 2, 3});
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("recovery: a spare keeps a standby worker per local rank while it waits: the lost node's ranks go "
          "to them when it takes the place, and they end with the job when it takes none", "[multinode]") {
  skipWithoutNetns("multi-node recovery test");
  NetnsCluster cluster(3);
  MarkerScope marker;
  TempDir dir;
  const NamespaceJob job(cluster, marker, "2", "recovery_timeout=30", 300);
  Process host0(job.throughPython(0, dir / "host0.jsonl"));
  Process host1(job.throughPython(1, dir / "host1.jsonl"));
  REQUIRE(host0.waitForLines("RW start", 2, scaled(30s)));
  REQUIRE(host1.waitForLines("RW start", 2, scaled(30s)));
  Process spare(job.throughPython(2, dir / "spare.jsonl"));
  REQUIRE(spare.waitForLines("SE importing", 2, scaled(30s)));  // its two standbys
  std::map<long, int> standbySlots;  // pid -> slot, of the standbys the spare kept while waiting
  auto readStandbys = [&](const std::vector<nlohmann::json>& events) {
    for (const auto& e : ofKind(events, "standby_started"))
      if (e.value("spare", false)) standbySlots[e["pid"].get<long>()] = e["slot"].get<int>();
  };

  SECTION("the lost node's ranks go to the standbys") {
    std::this_thread::sleep_for(scaled(1s));  // ... waiting in `import drun`
    host1.signal(SIGKILL);
    const RunResult lost = host1.wait();
    const std::vector<RunResult> runs = {host0.wait(), spare.wait()};
    checkRecoveredInPlace(runs);
    INFO(runs[1].describe());
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
    const std::vector<RunResult> runs = {host0.wait(), host1.wait(), spare.wait()};
    for (const RunResult& r : runs) {
      INFO(r.describe());
      REQUIRE_FALSE(r.timedOut);
      CHECK(r.status() == 0);
    }
    const auto events = readEvents(dir / "spare.jsonl");
    readStandbys(events);
    CHECK(standbySlots.size() == 2);
    CHECK(ofKind(events, "worker_started").empty());
  }
  CHECK(marker.leftovers(5s).empty());  // no standby outlives the job
}

// In-process recovery end to end (docs/recovery.md): drun --recovery in-process with
// recovery_worker (tests/recovery/), which plays the workers' side of a recovery over the
// workers' store without libdrun_comm: a dead worker is replaced by a process with the same ranks
// while the others keep theirs, the budget and the restart count are the job's, survivors that
// never join fall back to a restart that says why, and a recovery on one namespace host leaves
// the other host's workers running. A node lost: recovery_node_e2e_test.cpp.
#include <catch2/catch.hpp>
#include <map>
#include <regex>

#include "drun/common/test_skip.hpp"
#include "host_runs.hpp"
#include "launcher_e2e.hpp"
#include "netns.hpp"
#include "process.hpp"
#include "recovery_lines.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

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
  HostRuns hosts({on(0), on(1)});
  const std::vector<RunResult> runs = hosts.waitAll();
  INFO(hosts.describe());
  std::map<int, std::vector<Start>> byRank;
  std::map<int, long> done;
  int replacedOn = -1;
  for (size_t h = 0; h < runs.size(); ++h) {
    INFO("host " << h);
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

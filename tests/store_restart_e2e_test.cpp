// drun-rendezvous restarted under a running job (an upgrade, a systemd restart): the agents retry
// the store for --rdzv-conf reconnect_timeout and refill the fresh store from what they know, so
// the job goes on with its restart count and budget (TORCHELASTIC_RESTART_COUNT continues). When
// the same nodes come back, the running workers are not stopped at all; when the membership
// changed, the job re-forms. A store gone for longer ends every agent with a clear error, its
// workers stopped.
#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include "process.hpp"
#include "recovery_lines.hpp"
#include "time_scale.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

// A drun-rendezvous daemon on a fixed loopback port, so that a restarted one serves the same
// endpoint.
std::unique_ptr<Process> startDaemon(uint16_t port) {
  auto daemon = std::make_unique<Process>(
      RunOptions{{(buildDir() / "bin" / "drun-rendezvous").string(), "--host", "127.0.0.1",
                  "--port", std::to_string(port)},
                 {},
                 {},
                 120s});
  REQUIRE(daemon->waitForOutput(
      [](const std::string& out, const std::string&) {
        return out.find("listening on") != std::string::npos;
      },
      10s));
  return daemon;
}

void killDaemon(std::unique_ptr<Process>& daemon) {
  daemon->signal(SIGKILL);
  daemon->wait(10s);
  daemon.reset();
}

// Each worker prints its restart count; on count 0 rank 3 fails with 3 once every other rank has
// printed (else a rank stopped before its first line would make the count=0 tally short); on
// later counts every worker waits for $MARKS/go, then rank 3 fails with $FAIL_LATER (0: succeeds).
std::vector<std::string> workerProgram() {
  return {"sh", "-c",
          "echo RUN rank=$RANK count=$TORCHELASTIC_RESTART_COUNT pid=$$; touch $MARKS/$RANK-"
          "$TORCHELASTIC_RESTART_COUNT; "
          "if [ $TORCHELASTIC_RESTART_COUNT = 0 ]; then "
          "  if [ $RANK = 3 ]; then for i in $(seq 3000); do "
          "  [ -e $MARKS/0-0 ] && [ -e $MARKS/1-0 ] && [ -e $MARKS/2-0 ] && break; "
          "  sleep 0.01; done; exit 3; fi; sleep 60; exit 0; fi; "
          "for i in $(seq 6000); do [ -e $MARKS/go ] && break; sleep 0.01; done; "
          "if [ $RANK = 3 ]; then exit $FAIL_LATER; fi"};
}

std::unique_ptr<Process> startAgent(uint16_t port, const std::string& id, int maxRestarts,
                                    const TempDir& marks, int failLater, bool isHost = false) {
  std::vector<std::string> args = {"--nnodes", "2", "--nproc-per-node", "2", "--max-restarts",
                                   std::to_string(maxRestarts), "--rdzv-endpoint",
                                   "127.0.0.1:" + std::to_string(port), "--rdzv-id", id,
                                   "--rdzv-conf",
                                   std::string("reconnect_timeout=30,is_host=") + (isHost ? "1" : "0")};
  for (const auto& word : workerProgram()) args.push_back(word);
  return std::make_unique<Process>(drunCommand(
      args, {"MARKS=" + marks.path().string(), "FAIL_LATER=" + std::to_string(failLater)}, 120s));
}

void touch(const std::filesystem::path& path) { std::ofstream(path).put('\n'); }

// SIGKILL to the daemon, then a new (empty) one on the same port; then every worker of `agents`
// runs again (`count` lines, `runs` times each of its 2 workers) and $MARKS/go lets them end.
void restartDaemonUnder(std::unique_ptr<Process>& daemon, uint16_t port, const TempDir& marks,
                        const std::vector<Process*>& agents, const std::string& count, size_t lines) {
  killDaemon(daemon);
  daemon = startDaemon(port);
  for (Process* agent : agents) CHECK(agent->waitForLines(count, lines, 60s));
  touch(marks / "go");
}

}  // namespace

// The RUN lines of `out` with count `count`, as "rank=R ... pid=P" (sorted: one per worker run).
std::vector<std::string> runLines(const std::string& out, const std::string& count) {
  std::vector<std::string> lines;
  const std::regex line("RUN (rank=\\d+) (count=\\d+) (pid=\\d+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator(); ++it)
    if ((*it)[2] == "count=" + count) lines.push_back((*it)[1].str() + " " + (*it)[3].str());
  std::sort(lines.begin(), lines.end());
  return lines;
}

// A daemon on a fresh port and a 2-node job with budget 1 on it whose rank 3 failed once: both
// agents run count 1's workers, which wait for $MARKS/go.
struct JobAtCount1 {
  uint16_t port = freeLoopbackPort();
  std::unique_ptr<Process> daemon = startDaemon(port);
  TempDir marks;
  std::unique_ptr<Process> a, b;

  explicit JobAtCount1(const std::string& idPrefix) {
    const std::string id = idPrefix + randomHex(6);
    a = startAgent(port, id, 1, marks, 3);
    b = startAgent(port, id, 1, marks, 3);
    REQUIRE(a->waitForLines("count=1", 2, 60s));
    REQUIRE(b->waitForLines("count=1", 2, 60s));
  }
};

TEST_CASE("store restart: a daemon restarted while workers run: they keep running, the count and budget go on",
          "[e2e][rendezvous][store_restart]") {
  // Budget 1: rank 3 failed once (count 0 -> 1); after the daemon's restart it fails again, which
  // must end the job (count 1 of 1). A reset budget would run it a third time with count 0.
  JobAtCount1 job("restart-");
  auto& [port, daemon, marks, a, b] = job;
  killDaemon(daemon);
  daemon = startDaemon(port);
  auto kept = [](const std::string&, const std::string& err) {
    return err.find("the workers kept running") != std::string::npos;
  };
  CHECK(a->waitForOutput(kept, 60s));
  CHECK(b->waitForOutput(kept, 60s));
  touch(marks / "go");
  RunResult ra = a->wait(), rb = b->wait();
  INFO(ra.describe() << "\n" << rb.describe());
  for (const RunResult* r : {&ra, &rb}) {
    CHECK(r->status() == 3);
    CHECK_THAT(r->err, Catch::Contains("drun: root cause: rank 3"));
    CHECK(countLinesWith(r->out, "count=0") == 2);  // the first run only: never a reset count
    CHECK(runLines(r->out, "1").size() == 2);       // the same processes: not started again
    CHECK(countLinesWith(r->out, "count=2") == 0);
    CHECK_THAT(r->err, Catch::Contains("the workers keep running while this node reconnects"));
    CHECK_THAT(r->err, !Catch::Contains("re-forming the job"));
  }
}

TEST_CASE("store restart: under --recovery in-process a daemon restarted keeps the workers, and a rank killed "
          "after it is still recovered in place", "[e2e][rendezvous][store_restart]") {
  // Budget 2: rank 1 dies at its step 20 (generation 1, restart 1), the daemon is SIGKILLed and
  // restarted, then rank 3 is SIGKILLed: generation 2 (restart 2 of 2) must form in place. The
  // restarted store lost generation 1 and the count: without them being written again, the
  // second recovery would open generation 1 anew, which no survivor joins.
  const uint16_t port = freeLoopbackPort();
  auto daemon = startDaemon(port);
  MarkerScope marker;
  const std::string id = "inproc-restart-" + randomHex(6);
  std::vector<std::string> args = {"--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "2",
                                   "--recovery", "in-process", "--rdzv-endpoint",
                                   "127.0.0.1:" + std::to_string(port), "--rdzv-id", id, "--rdzv-conf",
                                   "reconnect_timeout=30,is_host=0"};
  for (const auto& word : recoveryWorker({"--die", "1:20", "--steps", "1500", "--step-ms", "20"}))
    args.push_back(word);
  Process a(drunCommand(args, {marker.env()}, scaled(120s)));
  Process b(drunCommand(args, {marker.env()}, scaled(120s)));
  std::string seen;  // the stderr of the agent looked at last
  auto saysOnBoth = [&](const std::string& what, std::chrono::milliseconds timeout) {
    auto says = [&](const std::string&, const std::string& err) {
      seen = err;
      return contains(err, what);
    };
    return a.waitForOutput(says, timeout) && b.waitForOutput(says, timeout);
  };
  REQUIRE(saysOnBoth("generation 1 formed", scaled(60s)));
  // Every rank took part in it (recovery_worker's calls there expect the store to stay).
  REQUIRE(a.waitForLines("RW formed", 2, scaled(30s)));
  REQUIRE(b.waitForLines("RW formed", 2, scaled(30s)));
  killDaemon(daemon);
  daemon = startDaemon(port);
  const bool kept = saysOnBoth("the workers kept running", scaled(60s));
  INFO(seen);
  REQUIRE(kept);
  // Rank 3's process, wherever it runs: SIGKILLed.
  long victim = 0;
  for (Process* p : {&a, &b})
    p->waitForOutput([&](const std::string& out, const std::string&) {
      for (const Start& s : starts(out))
        if (s.rank == 3) victim = s.pid;
      return true;
    }, 1s);
  REQUIRE(victim > 0);
  REQUIRE(::kill(static_cast<pid_t>(victim), SIGKILL) == 0);
  RunResult ra = a.wait(), rb = b.wait();
  INFO(ra.describe() << "\n" << rb.describe());
  std::map<int, std::vector<Start>> byRank;
  std::map<int, long> done;
  for (const RunResult* r : {&ra, &rb}) {
    REQUIRE_FALSE(r->timedOut);
    CHECK(r->status() == 0);
    CHECK(contains(r->err, "the workers keep running while this node reconnects"));
    CHECK(contains(r->err, "generation 2 formed"));
    CHECK_FALSE(contains(r->err, "restarting the job"));
    CHECK_FALSE(contains(r->err, "re-forming the job"));
    for (const Start& s : starts(r->out)) byRank[s.rank].push_back(s);
    for (auto [rank, pid] : donePids(r->out)) done[rank] = pid;
  }
  REQUIRE(byRank.size() == 4);
  // Ranks 0 and 2 ran in one process throughout; rank 1 in its generation-1 replacement, rank 3
  // in its generation-2 one, whose restart count carries the first recovery across the restart.
  for (int rank : {0, 2}) {
    REQUIRE(byRank[rank].size() == 1);
    CHECK(done[rank] == byRank[rank][0].pid);
  }
  REQUIRE(byRank[1].size() == 2);
  CHECK(byRank[1][1].gen == 1);
  CHECK(done[1] == byRank[1][1].pid);
  REQUIRE(byRank[3].size() == 2);
  CHECK(byRank[3][0].pid == victim);
  CHECK(byRank[3][1].gen == 2);
  CHECK(byRank[3][1].restart == 2);
  CHECK(done[3] == byRank[3][1].pid);
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("store restart: a worker that fails while the store is away is reported in the round that forms",
          "[e2e][rendezvous][store_restart]") {
  JobAtCount1 job("away-");
  auto& [port, daemon, marks, a, b] = job;
  killDaemon(daemon);
  touch(marks / "go");  // rank 3 fails now, with no store to report to
  std::this_thread::sleep_for(1500ms);
  daemon = startDaemon(port);
  RunResult ra = a->wait(), rb = b->wait();
  INFO(ra.describe() << "\n" << rb.describe());
  for (const RunResult* r : {&ra, &rb}) {
    CHECK(r->status() == 3);  // the budget was spent: the failure is not lost with the store
    CHECK_THAT(r->err, Catch::Contains("drun: root cause: rank 3"));
    CHECK(countLinesWith(r->out, "count=2") == 0);
  }
}

TEST_CASE("store restart: a daemon restarted while the job restarts: the new round keeps the count",
          "[e2e][rendezvous][store_restart]") {
  const uint16_t port = freeLoopbackPort();
  auto daemon = startDaemon(port);
  TempDir marks;
  const std::string id = "restarting-" + randomHex(6);
  auto a = startAgent(port, id, 2, marks, 0);
  auto b = startAgent(port, id, 2, marks, 0);
  // Both agents took the failure's verdict and are re-forming (or just started count 1).
  auto restarting = [](const std::string&, const std::string& err) {
    return err.find("restarting the job") != std::string::npos;
  };
  REQUIRE(a->waitForOutput(restarting, 60s));
  REQUIRE(b->waitForOutput(restarting, 60s));
  restartDaemonUnder(daemon, port, marks, {a.get(), b.get()}, "count=1", 2);
  RunResult ra = a->wait(), rb = b->wait();
  INFO(ra.describe() << "\n" << rb.describe());
  for (const RunResult* r : {&ra, &rb}) {
    CHECK(r->status() == 0);
    CHECK(countLinesWith(r->out, "count=0") == 2);
    CHECK(countLinesWith(r->out, "count=1") >= 2);
    CHECK(countLinesWith(r->out, "count=2") == 0);
  }
}

TEST_CASE("store restart: the embedded store's host restarts its agent: the job goes on with its count",
          "[e2e][rendezvous][store_restart]") {
  const uint16_t port = freeLoopbackPort();
  TempDir marks;
  const std::string id = "embedded-" + randomHex(6);
  auto host = startAgent(port, id, 1, marks, 3, /*isHost=*/true);
  auto other = startAgent(port, id, 1, marks, 3);
  REQUIRE(host->waitForLines("count=1", 2, 60s));
  REQUIRE(other->waitForLines("count=1", 2, 60s));
  // The host's agent dies with the store; started again, it hosts a fresh store, which the
  // survivor refills: the new agent runs with the job's count, and the budget stays spent.
  host->signal(SIGKILL);
  host->wait(10s);
  auto again = startAgent(port, id, 1, marks, 3, /*isHost=*/true);
  CHECK(again->waitForLines("count=1", 2, 60s));
  CHECK(other->waitForLines("count=1", 4, 60s));
  touch(marks / "go");
  RunResult ra = again->wait(), rb = other->wait();
  INFO(ra.describe() << "\n" << rb.describe());
  CHECK(ra.status() == 3);
  CHECK(rb.status() == 3);
  CHECK(countLinesWith(ra.out, "count=0") == 0);  // a reset count would start at 0 again
  CHECK(countLinesWith(ra.out, "count=2") + countLinesWith(rb.out, "count=2") == 0);
  CHECK(countLinesWith(rb.out, "count=1") == 4);
}

TEST_CASE("store restart: a store gone past reconnect_timeout stops every agent with a clear error",
          "[e2e][rendezvous][store_restart]") {
  const uint16_t port = freeLoopbackPort();
  auto daemon = startDaemon(port);
  TempDir marks;
  MarkerScope workers;
  const std::string id = "gone-" + randomHex(6);
  std::vector<std::unique_ptr<Process>> agents;
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> args = {"--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint",
                                     "127.0.0.1:" + std::to_string(port), "--rdzv-id", id,
                                     "--rdzv-conf", "is_host=0,reconnect_timeout=6",
                                     "sh", "-c", "echo UP; sleep 60"};
    agents.push_back(std::make_unique<Process>(drunCommand(args, {workers.env()}, 60s)));
  }
  for (auto& agent : agents) REQUIRE(agent->waitForLines("UP", 1, 30s));
  const auto killedAt = std::chrono::steady_clock::now();
  killDaemon(daemon);
  for (auto& agent : agents) {
    RunResult r = agent->wait();
    INFO(r.describe());
    CHECK(r.status() == 1);
    // One deadline only: the reconnect's, counted down (never one connect attempt's window).
    CHECK(std::regex_search(r.err, std::regex(R"(unreachable for 5s; retrying for [0-9.]+s more \(--rdzv-conf reconnect_timeout 6s\))")));
    CHECK_THAT(r.err, !Catch::Contains("cannot reach the rendezvous store"));
    CHECK_THAT(r.err, Catch::Contains("lost the store at 127.0.0.1:" + std::to_string(port)));
    CHECK_THAT(r.err, Catch::Contains("within 6s (--rdzv-conf reconnect_timeout)"));
  }
  // Within the window plus a connect attempt and the exit (generous: a loaded machine).
  CHECK(std::chrono::steady_clock::now() - killedAt < 30s);
  CHECK(workers.leftovers(5s).empty());
}

TEST_CASE("store restart: a bad reconnect_timeout is a usage error naming it",
          "[e2e][rendezvous][store_restart]") {
  RunResult r = run(drunCommand({"--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:1", "--rdzv-conf",
                                 "reconnect_timeout=soon", "/bin/true"},
                                {}, 30s));
  INFO(r.describe());
  CHECK(r.status() == 2);
  CHECK_THAT(r.err, Catch::Contains("reconnect_timeout"));
  CHECK_THAT(r.err, Catch::Contains("soon"));
}

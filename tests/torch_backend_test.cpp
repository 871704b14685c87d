// The torch.distributed backend "drun" (python/drun/torch: libdrun_comm inside PyTorch): the
// tutorial programs with the one word changed, on one node x 4 and on two namespace hosts x 2,
// checked as the gloo runs are (results recomputed from the world size) and against a gloo run
// of the same programs (the SGD loss curve); every collective x dtype x op against gloo's result
// in the same job (tests/torch/backend_matrix.py); DDP trained on both backends in one job
// (tests/torch/ddp_compare.py); a rank SIGKILLed mid-collective and a silent rank against
// init_process_group's timeout (tests/torch/peer_death.py); the init methods file://, tcp:// and
// store= (tests/torch/init_methods.py); asynchronous work (tests/torch/async_work.py); collectives
// issued from Future callbacks and DDP's powerSGD_hook against gloo (tests/torch/callbacks.py);
// a program's exit without destroy_process_group (tests/torch/exit_without_destroy.py); the default
// mismatch check (tests/torch/mismatch.py).
//
// PYTHONPATH names the built package (<build>/lib/drun/python) until the agent sets it for its
// workers. SKIPPED without torch, without the compiled drun.torch module (libtorch-dev), and the
// two-host test without network namespaces.
#include <catch2/catch.hpp>
#include <cmath>
#include <csignal>
#include <map>
#include <set>

#include "torch_jobs.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

const std::string kDrunBackend = "TUTORIAL_BACKEND=drun";

// rank -> epoch -> loss of the SGD tutorial's lines.
std::map<int, std::map<int, double>> sgdLosses(const std::string& out) {
  std::map<int, std::map<int, double>> losses;
  for (const auto& l : tagged(out, "SGD"))
    if (l.fields.count("epoch"))
      losses[l.rank()][std::stoi(l.fields.at("epoch"))] = std::stod(l.fields.at("loss"));
  return losses;
}

}  // namespace

TEST_CASE("torch backend drun: the tutorial programs on one node x 4 give gloo's results",
          "[torch]") {
  skipWithoutDrunTorch("tutorials on the drun backend");
  MarkerScope marker;
  const std::vector<std::string> args = {"--standalone", "--nproc-per-node", "4",
                                         torchProgram("tutorials.py").string()};
  auto gloo = run(singleNode(marker, args));
  auto drun = run(singleNode(marker, args, {kDrunBackend, drunPythonPath()}));
  INFO("--- gloo: " << gloo.describe() << "\n--- drun: " << drun.describe());
  REQUIRE(gloo.status() == 0);
  REQUIRE(drun.status() == 0);
  checkTutorials(gloo.out, 4);
  checkTutorials(drun.out, 4);
  // The same training on both backends: the same loss, epoch by epoch (the sums may be taken
  // in another order: float tolerance).
  auto a = sgdLosses(gloo.out), b = sgdLosses(drun.out);
  REQUIRE(a.size() == b.size());
  for (const auto& [rank, byEpoch] : a)
    for (const auto& [epoch, loss] : byEpoch) {
      INFO("rank " << rank << " epoch " << epoch);
      CHECK(std::abs(b[rank][epoch] - loss) <= 1e-4 * std::max(1.0, std::abs(loss)));
    }
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("torch backend drun: the tutorial programs on two namespace hosts x 2",
          "[torch][multinode]") {
  skipWithoutDrunTorch("tutorials on the drun backend on two hosts");
  skipWithoutNetns("tutorials on the drun backend on two hosts");
  // No GLOO_SOCKET_IFNAME: the route to the TCPStore's host picks the interface (every namespace
  // host's name resolves to loopback).
  checkTutorialsOnTwoHosts({kDrunBackend, drunPythonPath(), "GLOO_SOCKET_IFNAME"});
}

namespace {

// The MATRIX and DDP lines of a job of ranks 0..3 that ran backend_matrix and ddp_compare.
void checkMatrixAndDdp(const std::string& out) {
  std::set<int> matrixRanks, ddpRanks;
  for (const auto& l : tagged(out, "MATRIX")) {
    matrixRanks.insert(l.rank());
    CHECK(std::stoi(l.fields.at("checks")) > 250);
    CHECK(std::stoi(l.fields.at("gloo")) > 100);  // most results were gloo's too
  }
  for (const auto& l : tagged(out, "DDP")) {
    ddpRanks.insert(l.rank());
    CHECK(l.fields.at("ranks_equal") == "1");
    CHECK(std::stod(l.fields.at("loss_diff")) <= 1e-4);
    CHECK(std::stod(l.fields.at("param_diff")) <= 1e-4);
  }
  const std::set<int> all = {0, 1, 2, 3};
  CHECK(matrixRanks == all);
  CHECK(ddpRanks == all);
}

}  // namespace

TEST_CASE("torch backend drun: every collective x dtype x op, and DDP, against gloo in one job",
          "[torch]") {
  skipWithoutDrunTorch("drun vs gloo matrix");
  MarkerScope marker;
  auto r = run(singleNode(marker, {"--standalone", "--nproc-per-node", "4",
                                   torchProgram("tutorials.py").string(), "backend_matrix",
                                   "ddp_compare"},
                          {kDrunBackend, drunPythonPath()}));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  checkMatrixAndDdp(r.out);
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("torch backend drun: every collective x dtype x op, and DDP, against gloo on two "
          "namespace hosts x 2 (hierarchical)", "[torch][multinode]") {
  skipWithoutDrunTorch("drun vs gloo matrix on two hosts");
  skipWithoutNetns("drun vs gloo matrix on two hosts");
  TwoHosts job({"--nproc-per-node", "2"},
               {"python3", torchProgram("tutorials.py").string(), "backend_matrix", "ddp_compare"},
               {kDrunBackend, drunPythonPath()});
  auto runs = job.run();
  INFO(describe(runs));
  for (const auto& r : runs) REQUIRE(r.status() == 0);
  checkMatrixAndDdp(runs[0].out + runs[1].out);
  CHECK(job.marker.leftovers(5s).empty());
}

namespace {

// tests/torch/<program> on `world` ranks started directly (RANK, WORLD_SIZE; no launcher):
// argv[1] is a store file in a fresh directory, then `args`. Returns each rank's result.
std::vector<RunResult> runRanks(int world, const std::string& program,
                                const std::vector<std::string>& args, std::chrono::seconds bound) {
  MarkerScope marker;
  TempDir dir;
  std::vector<std::unique_ptr<Process>> ranks;
  for (int rank = 0; rank < world; ++rank) {
    RunOptions o;
    o.argv = {kTorchPython, torchProgram(program).string(), (dir / "store").string()};
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    o.env = {marker.env(), drunPythonPath(), "RANK=" + std::to_string(rank),
             "WORLD_SIZE=" + std::to_string(world), "OMP_NUM_THREADS=1"};
    o.timeout = bound;
    ranks.push_back(std::make_unique<Process>(o));
  }
  std::vector<RunResult> results;
  for (auto& p : ranks) results.push_back(p->wait());
  CHECK(marker.leftovers(5s).empty());
  return results;
}

// The checks whose `TAG rank=R check=C ok=1` lines in `out` say they passed.
std::set<std::string> passedChecks(const std::string& out, const std::string& tag) {
  std::set<std::string> passed;
  for (const auto& l : tagged(out, tag))
    if (l.fields.count("ok") && l.fields.at("ok") == "1") passed.insert(l.fields.at("check"));
  return passed;
}

std::vector<RunResult> runPeerDeath(int world, int victim, std::chrono::seconds timeout,
                                    const std::string& mode) {
  // The imports, then at most the timeout (the silent rank waits up to 3 of them).
  return runRanks(world, "peer_death.py",
                  {std::to_string(victim), std::to_string(timeout.count()), mode},
                  3 * timeout + 60s);
}

// Every rank but `victim` raised, explained it (`named`), within [minSeconds, maxSeconds).
void checkSurvivors(const std::vector<RunResult>& results, int victim, double minSeconds,
                    double maxSeconds) {
  for (int rank = 0; rank < static_cast<int>(results.size()); ++rank) {
    if (rank == victim) continue;
    const RunResult& r = results[rank];
    INFO("rank " << rank << ": " << r.describe());
    CHECK(r.status() == 0);
    bool raised = false;
    for (const auto& l : tagged(r.out, "DEATH")) {
      if (!l.fields.count("raised")) continue;
      raised = l.fields.at("raised") == "1";
      CHECK(l.fields.at("named") == "1");
      CHECK(std::stod(l.fields.at("seconds")) >= minSeconds);
      CHECK(std::stod(l.fields.at("seconds")) < maxSeconds);
    }
    CHECK(raised);
  }
}

}  // namespace

TEST_CASE("torch backend drun: a rank SIGKILLed mid-collective makes every survivor raise "
          "naming it", "[torch]") {
  skipWithoutDrunTorch("peer death on the drun backend");
  constexpr int kVictim = 2;
  auto results = runPeerDeath(4, kVictim, 30s, "kill");
  INFO("victim: " << results[kVictim].describe());
  CHECK(results[kVictim].signal == SIGKILL);
  checkSurvivors(results, kVictim, 0.0, 30.0);  // "rank 2 (pid N) is gone", well before 30 s
}

TEST_CASE("torch backend drun: a rank SIGKILLed on another namespace host is named by its "
          "heartbeat (two hosts x 2, TCPStore)", "[torch][multinode]") {
  skipWithoutDrunTorch("peer death across hosts on the drun backend");
  skipWithoutNetns("peer death across hosts on the drun backend");
  constexpr int kVictim = 3, kWorld = 4;  // ranks 0, 1 on host 0; 2, 3 on host 1
  MarkerScope marker;
  NetnsCluster cluster(2);
  const std::string store = "tcp://" + cluster.address(0) + ":29517";
  std::vector<std::unique_ptr<Process>> ranks;
  for (int rank = 0; rank < kWorld; ++rank) {
    const int host = rank / 2;
    RunOptions o;
    o.argv = cluster.exec(host, {kTorchPython, torchProgram("peer_death.py").string(), store,
                                 std::to_string(kVictim), "30", "kill"});
    o.env = {marker.env(), drunPythonPath(), "RANK=" + std::to_string(rank),
             "WORLD_SIZE=" + std::to_string(kWorld), "GROUP_RANK=" + std::to_string(host),
             "OMP_NUM_THREADS=1", "PATH=/usr/bin:/bin"};
    o.timeout = 150s;
    ranks.push_back(std::make_unique<Process>(o));
  }
  std::vector<RunResult> results;
  for (auto& p : ranks) results.push_back(p->wait());
  INFO("victim: " << results[kVictim].describe());
  CHECK(results[kVictim].signal == SIGKILL);
  checkSurvivors(results, kVictim, 0.0, 30.0);
  // Host 0's ranks see only a Gloo connection fail: the heartbeat names the rank and its host.
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank << ": " << results[rank].describe());
    auto lines = tagged(results[rank].out, "DEATH");
    bool heard = false;
    for (const auto& l : lines)
      if (l.fields.count("heard")) heard = l.fields.at("heard") == "1";
    CHECK(heard);
  }
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("torch backend drun: a silent rank makes the others' collective raise at "
          "init_process_group's timeout", "[torch]") {
  skipWithoutDrunTorch("timeout on the drun backend");
  constexpr int kSilent = 1;
  auto results = runPeerDeath(3, kSilent, 4s, "stall");
  INFO("silent rank: " << results[kSilent].describe());
  CHECK(results[kSilent].status() == 0);  // it saw the others give up
  checkSurvivors(results, kSilent, 3.5, 4.0 + 10.0);
}

TEST_CASE("torch backend drun: init_process_group through file://, tcp:// and a TCPStore",
          "[torch]") {
  skipWithoutDrunTorch("init methods of the drun backend");
  auto results = runRanks(2, "init_methods.py", {}, 120s);
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank << ": " << results[rank].describe());
    CHECK(results[rank].status() == 0);
    std::set<std::string> methods;
    for (const auto& l : tagged(results[rank].out, "INIT")) {
      methods.insert(l.fields.at("method"));
      CHECK(l.fields.at("sum") == "3");         // 1 + 2
      CHECK(l.fields.at("objects") == "0,1");  // all_gather_object
    }
    CHECK(methods == std::set<std::string>{"file", "tcp", "store"});
  }
}

TEST_CASE("torch backend drun: collectives return their work at once and complete in the "
          "background (wait, timeout, Future, overlap, send beside a queued all_reduce)",
          "[torch]") {
  skipWithoutDrunTorch("asynchronous work on the drun backend");
  auto results = runRanks(4, "async_work.py", {}, 120s);
  for (int rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank << ": " << results[rank].describe());
    CHECK(results[rank].status() == 0);
    auto lines = tagged(results[rank].out, "ASYNC");
    REQUIRE(lines.size() == 1);
    for (const char* field : {"pending_after_issue", "wait_timeout_raised", "completed_after_wait",
                              "future_ok", "overlap_ok", "p2p_ok", "values_ok"}) {
      INFO(field);
      CHECK(lines[0].fields.at(field) == "1");
    }
  }
}

TEST_CASE("torch backend drun: collectives issued from Future callbacks run (nested, raising, "
          "blocked past the timeout) and DDP with powerSGD_hook matches gloo, on 2 and 4 ranks",
          "[torch]") {
  skipWithoutDrunTorch("Future callbacks on the drun backend");
  const int world = GENERATE(2, 4);
  // callbacks.py ends a check that does not finish within 60 s itself (hung=1, exit 3).
  auto results = runRanks(world, "callbacks.py", {}, 300s);
  for (int rank = 0; rank < world; ++rank) {
    INFO("world " << world << " rank " << rank << ": " << results[rank].describe());
    CHECK(results[rank].status() == 0);
    for (const auto& l : tagged(results[rank].out, "CALLBACKS")) CHECK(l.fields.count("hung") == 0);
    CHECK(passedChecks(results[rank].out, "CALLBACKS") ==
          std::set<std::string>{"nested", "raises", "blocked", "powersgd"});
  }
}

TEST_CASE("torch backend drun: a program that ends without destroy_process_group, Future callbacks "
          "still pending, exits 0 (no abort in the interpreter's finalization), and so does a "
          "forked child of it",
          "[torch]") {
  skipWithoutDrunTorch("the exit of a drun program");
  for (int run = 0; run < 3; ++run) {
    auto results = runRanks(2, "exit_without_destroy.py", {}, 120s);
    for (int rank = 0; rank < 2; ++rank) {
      INFO("run " << run << " rank " << rank << ": " << results[rank].describe());
      CHECK(results[rank].status() == 0);
      const auto lines = tagged(results[rank].out, "EXIT");
      REQUIRE(lines.size() == 1);
      CHECK(lines[0].fields.at("child_status") == "0");
      CHECK_THAT(results[rank].err, !Catch::Contains("terminate called"));
    }
  }
}

TEST_CASE("torch backend drun: by default, an all_reduce of 3 floats against 4 and a barrier "
          "against an all_reduce raise on every rank, naming both sides, and the group goes on",
          "[torch]") {
  skipWithoutDrunTorch("the default mismatch check of the drun backend");
  auto results = runRanks(2, "mismatch.py", {}, 120s);
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank << ": " << results[rank].describe());
    CHECK(results[rank].status() == 0);
    CHECK(passedChecks(results[rank].out, "MISMATCH") ==
          std::set<std::string>{"counts", "barrier", "matched"});
  }
}

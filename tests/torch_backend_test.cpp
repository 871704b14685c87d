// The torch.distributed backend "drun" (python/drun/torch: libdrun_comm inside PyTorch): the
// tutorial programs with the one word changed, on one node x 4 and on two namespace hosts x 2,
// checked as the gloo runs are (results recomputed from the world size) and against a gloo run
// of the same programs (the SGD loss curve); every collective x dtype x op against gloo's result
// in the same job (tests/torch/backend_matrix.py); DDP trained on both backends in one job
// (tests/torch/ddp_compare.py); a rank SIGKILLed mid-collective (tests/torch/peer_death.py).
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
  checkTutorialsOnTwoHosts({kDrunBackend, drunPythonPath()});
}

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
  std::set<int> matrixRanks, ddpRanks;
  for (const auto& l : tagged(r.out, "MATRIX")) {
    matrixRanks.insert(l.rank());
    CHECK(std::stoi(l.fields.at("checks")) > 250);
    CHECK(std::stoi(l.fields.at("gloo")) > 100);  // most results were gloo's too
  }
  std::set<std::string> lastLosses;
  for (const auto& l : tagged(r.out, "DDP")) {
    ddpRanks.insert(l.rank());
    CHECK(l.fields.at("ranks_equal") == "1");
    CHECK(std::stod(l.fields.at("loss_diff")) <= 1e-4);
    CHECK(std::stod(l.fields.at("param_diff")) <= 1e-4);
  }
  const std::set<int> all = {0, 1, 2, 3};
  CHECK(matrixRanks == all);
  CHECK(ddpRanks == all);
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("torch backend drun: a rank SIGKILLed mid-collective makes every survivor raise "
          "naming it", "[torch]") {
  skipWithoutDrunTorch("peer death on the drun backend");
  constexpr int kWorld = 4, kVictim = 2;
  constexpr auto kTimeout = 30s;
  MarkerScope marker;
  TempDir dir;
  std::vector<std::unique_ptr<Process>> ranks;
  for (int rank = 0; rank < kWorld; ++rank) {
    RunOptions o;
    o.argv = {kTorchPython, torchProgram("peer_death.py").string(), (dir / "store").string(),
              std::to_string(kVictim), std::to_string(kTimeout.count())};
    o.env = {marker.env(), drunPythonPath(), "RANK=" + std::to_string(rank),
             "WORLD_SIZE=" + std::to_string(kWorld), "OMP_NUM_THREADS=1"};
    o.timeout = kTimeout + 60s;  // the imports, then at most the timeout
    ranks.push_back(std::make_unique<Process>(o));
  }
  for (int rank = 0; rank < kWorld; ++rank) {
    RunResult r = ranks[rank]->wait();
    INFO("rank " << rank << ": " << r.describe());
    if (rank == kVictim) {
      CHECK(r.signal == SIGKILL);
      continue;
    }
    CHECK(r.status() == 0);
    auto lines = tagged(r.out, "DEATH");
    bool raised = false;
    for (const auto& l : lines) {
      if (!l.fields.count("raised")) continue;
      raised = l.fields.at("raised") == "1";
      CHECK(l.fields.at("named") == "1");  // "rank 2 ... is gone"
      CHECK(std::stod(l.fields.at("seconds")) < std::chrono::duration<double>(kTimeout).count());
    }
    CHECK(raised);
  }
  CHECK(marker.leftovers(5s).empty());
}

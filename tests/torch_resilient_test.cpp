// drun.torch.resilient and drun.torch.State (python/drun/torch): outside drun
// (tests/torch/resilient_unit.py), and the DDP tutorial's model trained under
// `drun --recovery in-process --nproc-per-node 3` (tests/torch/resilient_train.py) on the drun and
// the gloo backends: ranks SIGKILL themselves at given steps, the job ends with exit 0, every rank
// holds the same parameters after each recovery, and the final parameters are those of a run
// without a failure (the data of a step depends on the step and the rank only). A program that
// never uses the API falls back to a restart (tests/torch/never_joins.py); under --recovery
// restart the resilient program runs again from step 0. abort_gloo (what the generation watcher
// does to a gloo group) ends a pending recv at once (tests/torch/gloo_abort.py).
//
// SKIPPED without torch or without the compiled drun.torch module.
#include <signal.h>

#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "process.hpp"

#include "time_scale.hpp"
#include "torch_jobs.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

constexpr int kWorld = 3;
constexpr int kSteps = 30;

struct Training {
  RunResult result;
  std::vector<Tagged> enters;        // ENTER lines, in output order
  std::map<int, std::string> final;  // rank -> hash of its final parameters
};

Training train(const std::string& backend, const std::string& recovery, const std::string& kill,
               const std::string& killInRecovery = "") {
  MarkerScope marker;
  Training t;
  t.result = run(singleNode(
      marker,
      {"--standalone", "--nproc-per-node", std::to_string(kWorld), "--recovery", recovery,
       "--max-restarts", "3", torchProgram("resilient_train.py").string()},
      {drunPythonPath(), "TRAIN_BACKEND=" + backend, "TRAIN_STEPS=" + std::to_string(kSteps),
       "TRAIN_KILL=" + kill, "TRAIN_KILL_IN_RECOVERY=" + killInRecovery}));
  t.enters = tagged(t.result.out, "ENTER");
  for (const auto& l : tagged(t.result.out, "FINAL")) {
    CHECK(l.fields.at("step") == std::to_string(kSteps));
    t.final[l.rank()] = l.fields.at("sum");
  }
  CHECK(marker.leftovers(5s).empty());
  return t;
}

// Every rank finished, with one hash, the reference's.
void checkFinal(const Training& t, const std::string& reference) {
  REQUIRE(t.final.size() == static_cast<size_t>(kWorld));
  for (const auto& [rank, sum] : t.final) {
    INFO("rank " << rank);
    CHECK(sum == reference);
  }
}

// After each entry (the first, and each recovery's), the ranks' parameters were equal.
void checkEntries(const Training& t, const std::multiset<std::string>& expectedGenerations) {
  std::multiset<std::string> generations;
  for (const auto& l : t.enters) {
    INFO("ENTER rank " << l.rank() << " generation " << l.fields.at("generation"));
    CHECK(l.fields.at("equal") == "1");
    generations.insert(l.fields.at("generation"));
  }
  CHECK(generations == expectedGenerations);
}

std::multiset<std::string> entries(std::vector<std::string> generations) {
  std::multiset<std::string> all;
  for (const auto& g : generations)
    for (int r = 0; r < kWorld; ++r) all.insert(g);
  return all;
}

// `generations`: those the ranks enter after the first (each rank enters each once).
void recoversInProcess(const std::string& backend, const std::string& kill, std::vector<std::string> generations,
                       const std::string& killInRecovery = "") {
  auto reference = train(backend, "in-process", "");
  INFO("--- without a failure: " << reference.result.describe());
  REQUIRE(reference.result.status() == 0);
  REQUIRE(reference.final.size() == static_cast<size_t>(kWorld));
  const std::string expected = reference.final.begin()->second;
  checkFinal(reference, expected);

  auto failing = train(backend, "in-process", kill, killInRecovery);
  INFO("--- with " << kill << " SIGKILLed (and " << killInRecovery << " in the recovery): " << failing.result.describe());
  REQUIRE(failing.result.status() == 0);
  checkFinal(failing, expected);
  generations.insert(generations.begin(), "0");
  checkEntries(failing, entries(generations));
  // A recovery went back to the last commit, never to step 0.
  for (const auto& l : failing.enters)
    if (l.fields.at("generation") != "0") CHECK(std::stoi(l.fields.at("step")) > 0);
}

}  // namespace

TEST_CASE("drun.torch.resilient outside drun: runs once with one warning, TypeError, commit and restore",
          "[torch]") {
  skipWithoutDrunTorch("drun.torch.State outside drun");
  RunOptions o;
  o.argv = {kTorchPython, torchProgram("resilient_unit.py").string()};
  o.env = {drunPythonPath(), "DRUN_RECOVERY", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS=1"};
  o.timeout = 120s;
  auto r = run(o);
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  CHECK(r.out.find("RESILIENT_UNIT ok") != std::string::npos);
}

TEST_CASE("drun.torch.resilient on the drun backend: ranks 1 and 0 SIGKILLed, two recoveries in place, "
          "the parameters of a run without a failure", "[torch]") {
  skipWithoutDrunTorch("in-process recovery on the drun backend");
  recoversInProcess("drun", "1:8,0:20", {"1", "2"});
}

TEST_CASE("drun.torch.resilient on gloo: rank 0 SIGKILLed, its group re-created over the workers' store, "
          "the parameters of a run without a failure", "[torch]") {
  skipWithoutDrunTorch("in-process recovery on gloo");
  recoversInProcess("gloo", "0:12", {"1"});
}

// Rank 0 dies (generation 1), rank 2 as it sees generation 1 begin (generation 2, while rank 0's
// replacement still imports torch): the replacements of generation 1 and of generation 2 both get
// through init_process_group, and every rank enters generation 2, with no restart.
TEST_CASE("drun.torch.resilient on the drun backend: rank 2 SIGKILLed during the recovery of rank 0, the "
          "replacements of both generations join generation 2", "[torch]") {
  skipWithoutDrunTorch("a second death during an in-process recovery on the drun backend");
  recoversInProcess("drun", "0:12", {"2"}, "2");
}

TEST_CASE("drun.torch.resilient on gloo: rank 2 SIGKILLed during the recovery of rank 0, the replacements "
          "of both generations join generation 2", "[torch]") {
  skipWithoutDrunTorch("a second death during an in-process recovery on gloo");
  recoversInProcess("gloo", "0:12", {"2"}, "2");
}

TEST_CASE("drun.torch.resilient under --recovery restart runs again from step 0", "[torch]") {
  skipWithoutDrunTorch("resilient under --recovery restart");
  auto reference = train("drun", "restart", "");
  REQUIRE(reference.result.status() == 0);
  REQUIRE(reference.final.size() == static_cast<size_t>(kWorld));
  auto failing = train("drun", "restart", "1:12");
  INFO("--- restart: " << failing.result.describe());
  REQUIRE(failing.result.status() == 0);
  checkFinal(failing, reference.final.begin()->second);
  for (const auto& l : failing.enters) CHECK(l.fields.at("step") == "0");
  CHECK(failing.enters.size() == static_cast<size_t>(2 * kWorld));  // each attempt entered once
}

TEST_CASE("in-process recovery of a program that never uses drun.torch falls back to a restart, "
          "saying the survivors never joined", "[torch]") {
  skipWithoutPythonModule("in-process fallback", "os", "python3");
  MarkerScope marker;
  auto r = run(singleNode(marker,
                          {"--standalone", "--nproc-per-node", std::to_string(kWorld), "--recovery",
                           "in-process", "--rdzv-conf", "recovery_timeout=3", "--max-restarts", "2",
                           torchProgram("never_joins.py").string(), "1"},
                          {drunPythonPath()}));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  CHECK(r.err.find("the survivors never joined the recovery") != std::string::npos);
  // The replacement started, then the restarted job ran every rank again.
  std::multiset<std::string> starts;
  for (const auto& l : tagged(r.out, "NEVERJOINS"))
    starts.insert(l.fields.at("generation") + "/" + (l.fields.at("restart") == "0" ? "first" : "again"));
  CHECK(starts.count("0/first") == static_cast<size_t>(kWorld));
  CHECK(starts.count("1/again") == 1);  // the replacement sees the count with its recovery
  CHECK(starts.count("0/again") == static_cast<size_t>(kWorld));
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("abort_gloo fails a gloo group's pending recv and later collectives at once", "[torch]") {
  skipWithoutDrunTorch("abort_gloo");
  MarkerScope marker;
  auto r = run(singleNode(marker, {"--standalone", "--nproc-per-node", "2",
                                   torchProgram("gloo_abort.py").string()},
                          {drunPythonPath()}));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  auto lines = tagged(r.out, "GLOOABORT");
  REQUIRE(lines.size() == 2);
  for (const auto& l : lines) {
    if (l.rank() != 0) continue;
    CHECK(std::stoi(l.fields.at("sockets")) >= 1);
    // Aborted after 1 s: the recv ended then, not at the group's 60 s timeout.
    CHECK(std::stod(l.fields.at("recv_s")) < 1.0 + 5.0 * timeScale());
    CHECK(std::stod(l.fields.at("later_s")) < 1.0 * timeScale());
  }
  CHECK(marker.leftovers(5s).empty());
}

// Two namespace hosts of a 1:2 job on gloo and on the drun backend, two ranks each; host 1's drun
// SIGKILLed while the job trains, and no spare comes: host 0's ranks shrink in place to ranks 0
// and 1 of 2 (their processes kept, on_resize told; gloo's group re-created, the drun group's
// communicator reformed and handed to a group of the new size), their parameters equal after the
// shrink and at the end.
TEST_CASE("drun.torch.resilient on gloo and on the drun backend: a node SIGKILLed with no spare, the "
          "survivors shrink in place with DDP, equal parameters after", "[torch][multinode]") {
  skipWithoutDrunTorch("elastic in place");
  skipWithoutNetns("elastic in place");
  const std::string backend = GENERATE(as<std::string>(), "gloo", "drun");
  INFO("backend " << backend);
  TwoHosts job({"--nproc-per-node", "2", "--recovery", "in-process", "--max-restarts", "1", "--rdzv-conf",
                "recovery_timeout=3,last_call_timeout=1"},
               {"python3", torchProgram("resilient_train.py").string()},
               {drunPythonPath(), "TRAIN_BACKEND=" + backend, "TRAIN_STEPS=150", "TRAIN_STEP_MS=40"});
  job.args[1] = "1:2";  // --nnodes
  Process host0(job.on(0));
  Process host1(job.on(1));
  REQUIRE(host0.waitForLines("ENTER", 2, scaled(90s)));
  REQUIRE(host1.waitForLines("ENTER", 2, scaled(90s)));
  host1.signal(SIGKILL);
  host1.wait();
  const RunResult r = host0.wait();
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  CHECK(contains(r.err, "the job shrinks in place from 4 to 2 ranks (2 to 1 nodes)"));
  CHECK_FALSE(contains(r.err, "restarting the job"));
  const auto enters = tagged(r.out, "ENTER");
  const auto resized = tagged(r.out, "RESIZED");
  const auto finals = tagged(r.out, "FINAL");
  std::map<std::string, std::string> firstEntryPid;  // pid of each process's first entry
  for (const auto& l : enters) firstEntryPid.emplace(l.fields.at("pid"), l.fields.at("generation"));
  CHECK(firstEntryPid.size() == 2);  // two processes on host 0, the same ones throughout
  REQUIRE(resized.size() == 2);
  std::set<int> ranks;
  for (const auto& l : resized) {
    CHECK(l.fields.at("from") == "4");
    CHECK(l.fields.at("to") == "2");
    CHECK(firstEntryPid.count(l.fields.at("pid")) == 1);
    ranks.insert(l.rank());
  }
  CHECK(ranks == std::set<int>{0, 1});
  int afterShrink = 0;
  for (const auto& l : enters) {
    INFO("ENTER rank " << l.rank() << " generation " << l.fields.at("generation"));
    CHECK(l.fields.at("equal") == "1");
    afterShrink += l.fields.at("generation") != "0";
  }
  CHECK(afterShrink == 2);
  REQUIRE(finals.size() == 2);
  CHECK(finals[0].fields.at("sum") == finals[1].fields.at("sum"));
  for (const auto& l : finals) CHECK(l.fields.at("step") == "150");
}

namespace {

// The same job, host 1's drun started again after the shrink: it is taken in at a commit (a
// grow), host 0's ranks keep their processes and ranks in the world of 4 again (on_resize told),
// the newcomer's ranks 2 and 3 receive the committed state, and every rank ends equal.
void shrinkThenGrow(const std::string& backend) {
  // recovery_timeout: the newcomer's workers start (import torch, on a busy machine) within it.
  TwoHosts job({"--nproc-per-node", "2", "--recovery", "in-process", "--max-restarts", "1", "--rdzv-conf",
                "recovery_timeout=15,last_call_timeout=1"},
               {"python3", torchProgram("resilient_train.py").string()},
               {drunPythonPath(), "TRAIN_BACKEND=" + backend, "TRAIN_STEPS=900", "TRAIN_STEP_MS=40"});
  job.args[1] = "1:2";  // --nnodes
  Process host0(job.on(0));
  auto host1 = std::make_unique<Process>(job.on(1));
  REQUIRE(host0.waitForLines("ENTER", 2, scaled(90s)));
  REQUIRE(host1->waitForLines("ENTER", 2, scaled(90s)));
  host1->signal(SIGKILL);
  host1->wait();
  REQUIRE(host0.waitForLines("RESIZED", 2, scaled(60s)));
  host1 = std::make_unique<Process>(job.on(1));
  const RunResult back = host1->wait();
  const RunResult r = host0.wait();
  INFO(r.describe());
  INFO(back.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  CHECK(back.status() == 0);
  CHECK(contains(r.err, "the job shrinks in place from 4 to 2 ranks (2 to 1 nodes)"));
  CHECK(contains(r.err, "a node joins the running job in place: world 2 -> 4 ranks (1 -> 2 nodes)"));
  CHECK_FALSE(contains(r.err, "restarting the job"));
  std::set<std::string> pids;  // host 0's processes, the same ones throughout
  for (const auto& l : tagged(r.out, "ENTER")) pids.insert(l.fields.at("pid"));
  CHECK(pids.size() == 2);
  int grown = 0;
  for (const auto& l : tagged(r.out, "RESIZED")) grown += l.fields.at("to") == "4";
  CHECK(grown >= 2);
  std::vector<std::string> sums;
  for (const RunResult* run : {&r, &back})
    for (const auto& l : tagged(run->out, "FINAL")) {
      CHECK(l.fields.at("step") == "900");
      sums.push_back(l.fields.at("sum"));
    }
  REQUIRE(sums.size() == 4);
  for (const std::string& s : sums) CHECK(s == sums[0]);
}

}  // namespace

TEST_CASE("drun.torch.resilient on gloo: a node SIGKILLed, the survivors shrink in place, the node's agent "
          "started again is taken in at a commit, equal parameters after", "[torch][multinode]") {
  skipWithoutDrunTorch("elastic in place on gloo");
  skipWithoutNetns("elastic in place on gloo");
  shrinkThenGrow("gloo");
}

// On the drun backend the survivors' communicator reforms in place twice (smaller, then larger)
// and is handed to a default group of the new size each time; the newcomer's ranks form the
// grow's generation with them.
TEST_CASE("drun.torch.resilient on the drun backend: a node SIGKILLed, the survivors shrink in place, the node's "
          "agent started again is taken in at a commit, equal parameters after", "[torch][multinode]") {
  skipWithoutDrunTorch("elastic in place on the drun backend");
  skipWithoutNetns("elastic in place on the drun backend");
  shrinkThenGrow("drun");
}

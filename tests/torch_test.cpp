// Real PyTorch programs under drun: the tutorials' torch.distributed programs (tests/torch/:
// point-to-point, all_reduce + all_gather, barrier-synchronised tasks, group all_reduce,
// distributed SGD), each with init_process_group("gloo") through env://, on one node and on two
// network-namespace hosts; a program whose exception, recorded by torch's @record, must reach
// drun's failure summary (one node, and both nodes of two); a program that fails on its first
// attempt and succeeds after a restart (two hosts: TORCHELASTIC_RESTART_COUNT is the job's).
//
// The programs print `TAG rank=R ...` lines; the checks recompute what each rank must have got.
// Debian's torch is for /usr/bin/python3 (`python3` on PATH may lack it): each test names its
// interpreter as a user would, through PYTHON_EXEC or PATH. SKIPPED without it (and the
// two-host tests without network namespaces). Importing torch costs seconds here, so the
// tutorials run in one job (tests/torch/tutorials.py runs them one after the other).
#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "torch_jobs.hpp"

using namespace drun::test;
using namespace std::chrono_literals;


TEST_CASE("torch: the tutorial programs on one node with 4 ranks (PYTHON_EXEC)", "[torch]") {
  skipWithoutTorch("torch tutorials");
  MarkerScope marker;
  auto r = run(singleNode(marker, {"--standalone", "--nproc-per-node", "4",
                                   torchProgram("tutorials.py").string()}));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  checkTutorials(r.out, 4);
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("torch: the tutorial programs on two namespace hosts with 2 ranks each (python3 on "
          "PATH)", "[torch][multinode]") {
  skipWithoutTorch("torch tutorials on two hosts");
  skipWithoutNetns("torch tutorials on two hosts");
  checkTutorialsOnTwoHosts();
}

TEST_CASE("torch: an exception recorded by @record reaches drun's failure summary", "[torch]") {
  skipWithoutTorch("@record");
  MarkerScope marker;
  const std::string message = "tutorial failure " + randomHex(12);
  auto r = run(singleNode(marker, {"--nproc-per-node", "2",
                                   torchProgram("record_error.py").string(), "1", message}));
  INFO(r.describe());
  CHECK(r.status() == 1);  // the worker's exit code (the @record wrapper re-raises)
  CHECK(tagged(r.out, "RECORD").size() == 2);  // both ranks did their all_reduce first
  // The summary names rank 1 and quotes the error file torch wrote, not only stderr.
  auto at = r.err.find("drun: root cause: rank 1 (local_rank 1)");
  REQUIRE(at != std::string::npos);
  const std::string summary = r.err.substr(at);
  CHECK_THAT(summary, Catch::Contains("exited with code 1"));
  // (Without --log-dir the file is in a temporary directory removed at exit: not named.)
  CHECK_THAT(summary, Catch::Contains("\ndrun:   error file") &&
                          !Catch::Contains("last lines of stderr"));
  CHECK_THAT(summary, Catch::Contains("drun:     ValueError: " + message));
  CHECK_THAT(summary, Catch::Contains("record_error.py"));  // the recorded call stack
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("torch: @record's error from host 1 reaches the failure summary of both hosts",
          "[torch][multinode]") {
  skipWithoutTorch("@record on two hosts");
  skipWithoutNetns("@record on two hosts");
  const std::string message = "tutorial failure on host 1 " + randomHex(12);
  TwoHosts job({"--nproc-per-node", "2"},
               {"python3", torchProgram("record_error.py").string(), "3", message});
  auto runs = job.run();
  INFO(describe(runs));
  for (const auto& r : runs) {
    CHECK(r.status() == 1);
    // Host 0 learns it through the store: the same root cause, the same recorded exception.
    auto at = r.err.find("drun: root cause: rank 3 (local_rank 1) on ");
    REQUIRE(at != std::string::npos);
    CHECK_THAT(r.err.substr(at), Catch::Contains("drun:     ValueError: " + message));
  }
  CHECK(tagged(runs[0].out + runs[1].out, "RECORD").size() == 4);
  CHECK(job.marker.leftovers(5s).empty());
}

TEST_CASE("torch: a program failing on its first attempt succeeds after one restart on two "
          "namespace hosts", "[torch][multinode]") {
  skipWithoutTorch("fail once");
  skipWithoutNetns("fail once");
  // Rank 3 (on host 1, not the store's) exits 3 on restart 0.
  TwoHosts job({"--nproc-per-node", "2", "--max-restarts", "1"},
               {"python3", torchProgram("fail_once.py").string(), "3"});
  auto runs = job.run();
  INFO(describe(runs));
  std::map<std::string, std::multiset<int>> ranksByRestart;
  for (const auto& r : runs) {
    CHECK(r.status() == 0);
    CHECK_THAT(r.err, Catch::Contains("rank 3") && Catch::Contains("restarting the job"));
    for (const auto& l : tagged(r.out, "FAILONCE")) {
      if (!l.fields.count("restart")) continue;  // "fails on purpose" goes to stderr
      CHECK(l.fields.at("world") == "4");
      CHECK(l.fields.at("sum") == "4");  // a complete process group in both attempts
      ranksByRestart[l.fields.at("restart")].insert(l.rank());
    }
  }
  const std::multiset<int> all = {0, 1, 2, 3};
  CHECK(ranksByRestart["0"] == all);
  CHECK(ranksByRestart["1"] == all);
  CHECK(ranksByRestart.size() == 2);
  CHECK(job.marker.leftovers(5s).empty());
}

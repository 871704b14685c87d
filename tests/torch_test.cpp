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
#include <functional>
#include <map>
#include <regex>
#include <set>

#include "netns.hpp"
#include "process.hpp"
#include "torch_python.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

constexpr auto kJobTimeout = 120s;  // hang guard of one drun (torch imports take seconds each)

// `KEY=VALUE` words of the lines tagged `tag` on drun's stdout, with the console's rank prefix.
struct Tagged {
  int consoleRank;
  std::map<std::string, std::string> fields;
  int rank() const { return std::stoi(fields.at("rank")); }
};

std::vector<Tagged> tagged(const std::string& out, const std::string& tag) {
  static const std::regex word(R"((\w+)=(\S+))");
  std::vector<Tagged> found;
  for (const auto& line : parseConsole(out)) {
    if (line.text.rfind(tag + " ", 0) != 0) continue;
    Tagged t{line.rank, {}};
    for (std::sregex_iterator it(line.text.begin(), line.text.end(), word), end; it != end; ++it)
      t.fields[(*it)[1]] = (*it)[2];
    if (t.fields.count("rank")) found.push_back(std::move(t));
  }
  return found;
}

std::string seq(int n, const std::function<int(int)>& f) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(f(i));
  return s;
}

// Every tutorial's result on every rank of a job of `world` ranks; `out` is the stdout of all
// its drun agents together.
void checkTutorials(const std::string& out, int world) {
  auto once = [&](const std::vector<Tagged>& lines, const char* what) {
    INFO(what);
    std::multiset<int> ranks;
    for (const auto& l : lines) {
      ranks.insert(l.rank());
      CHECK(l.consoleRank == l.rank());  // drun's prefix is the global rank
    }
    std::multiset<int> expected;
    for (int r = 0; r < world; ++r) expected.insert(r);
    CHECK(ranks == expected);
  };

  auto p2p = tagged(out, "P2P");
  once(p2p, "point_to_point");
  for (const auto& l : p2p) {
    INFO("P2P rank " << l.rank());
    CHECK(l.fields.at("recv") == "1");  // rank 0's tensor reached everyone (rank 0 made it)
    CHECK(l.fields.at("ring") == std::to_string(((l.rank() + world - 1) % world + 1) * 10));
  }

  auto reduce = tagged(out, "REDUCE");
  once(reduce, "reductions");
  for (const auto& l : reduce) {
    INFO("REDUCE rank " << l.rank());
    CHECK(l.fields.at("sum") == seq(world, [&](int) { return world * (world - 1) / 2; }));
    CHECK(l.fields.at("gathered") == seq(world, [](int i) { return i; }));
  }

  auto sync = tagged(out, "SYNC");
  CHECK(sync.size() == static_cast<size_t>(2 * world));
  for (int task = 0; task < 2; ++task) {
    INFO("synchronizing task " << task);
    double lastStart = 0, firstEnd = 1e300;
    int n = 0;
    for (const auto& l : sync) {
      if (l.fields.at("task") != std::to_string(task)) continue;
      ++n;
      lastStart = std::max(lastStart, std::stod(l.fields.at("start")));
      firstEnd = std::min(firstEnd, std::stod(l.fields.at("end")));
    }
    CHECK(n == world);
    CHECK(lastStart <= firstEnd);  // the barrier: no rank ended before every rank had started
  }

  auto group = tagged(out, "GROUP");
  once(group, "group_all_reduce");
  for (const auto& l : group) {
    INFO("GROUP rank " << l.rank());
    bool member = l.rank() < 2;
    CHECK(l.fields.at("member") == (member ? "1" : "0"));
    CHECK(l.fields.at("value") == (member ? "2" : "1"));
  }

  auto sgd = tagged(out, "SGD");
  std::set<std::string> digests;
  std::map<int, std::map<int, double>> losses;  // rank -> epoch -> loss
  for (const auto& l : sgd) {
    if (l.fields.count("params")) digests.insert(l.fields.at("params"));
    if (l.fields.count("epoch"))
      losses[l.rank()][std::stoi(l.fields.at("epoch"))] = std::stod(l.fields.at("loss"));
  }
  CHECK(losses.size() == static_cast<size_t>(world));
  for (const auto& [rank, byEpoch] : losses) {
    INFO("SGD rank " << rank);
    REQUIRE(byEpoch.size() == 4);
    CHECK(byEpoch.rbegin()->second < byEpoch.begin()->second / 10);  // it learned
  }
  // The replicas trained on different partitions and still agree: the gradients were averaged.
  CHECK(digests.size() == 1);

  once(tagged(out, "TUTORIALS"), "tutorials.py ran them all");
  for (const auto& l : tagged(out, "TUTORIALS")) CHECK(l.fields.at("done") == "5");
}

void skipWithoutNetns(const std::string& test) {
  if (auto why = NetnsCluster::unavailableReason()) skipTest(test + ": " + *why);
}

// One drun per host of a fresh namespace cluster, endpoint on host 0. Python is found on PATH,
// which puts Debian's interpreter first; gloo is told the hosts' interface (every namespace host
// shares this machine's hostname, which resolves to loopback: the seed's GLOO_SOCKET_IFNAME note).
struct TwoHosts {
  TwoHosts(std::vector<std::string> drunArgs, std::vector<std::string> program)
      : cluster(2), args(std::move(drunArgs)) {
    std::vector<std::string> head = {"--nnodes", "2", "--rdzv-endpoint",
                                     cluster.address(0) + ":29400", "--rdzv-id",
                                     "torch-" + randomHex(8)};
    args.insert(args.begin(), head.begin(), head.end());
    args.insert(args.end(), program.begin(), program.end());
  }

  RunOptions on(int host) const {
    std::vector<std::string> argv = {drunPath().string(), "--local-addr", cluster.address(host)};
    argv.insert(argv.end(), args.begin(), args.end());
    RunOptions o;
    o.argv = cluster.exec(host, argv);
    o.env = {marker.env(), "PATH=/usr/bin:/bin", "GLOO_SOCKET_IFNAME=eth0", "OMP_NUM_THREADS=1"};
    o.timeout = kJobTimeout;
    return o;
  }

  std::vector<RunResult> run() const {
    Process a(on(0)), b(on(1));
    return {a.wait(), b.wait()};
  }

  NetnsCluster cluster;
  MarkerScope marker;
  std::vector<std::string> args;
};

std::string describe(const std::vector<RunResult>& runs) {
  std::string all;
  for (size_t i = 0; i < runs.size(); ++i)
    all += "--- drun on host " + std::to_string(i) + ": " + runs[i].describe() + "\n";
  return all;
}

// drun with PYTHON_EXEC naming Debian's interpreter (`python3` on PATH may lack torch).
RunOptions singleNode(const MarkerScope& marker, std::vector<std::string> args) {
  return drunCommand(std::move(args),
                     {marker.env(), std::string("PYTHON_EXEC=") + kTorchPython,
                      "OMP_NUM_THREADS=1"},
                     kJobTimeout);
}

}  // namespace

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
  TwoHosts job({"--nproc-per-node", "2"}, {"python3", torchProgram("tutorials.py").string()});
  auto runs = job.run();
  INFO(describe(runs));
  for (const auto& r : runs) REQUIRE(r.status() == 0);
  checkTutorials(runs[0].out + runs[1].out, 4);
  // Each host ran its own two ranks: node rank 0 (the endpoint's) ranks 0-1.
  for (const auto& l : tagged(runs[0].out, "TUTORIALS")) CHECK(l.rank() < 2);
  for (const auto& l : tagged(runs[1].out, "TUTORIALS")) CHECK(l.rank() >= 2);
  CHECK(job.marker.leftovers(5s).empty());
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

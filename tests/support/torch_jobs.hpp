// What the tests that run torch programs under drun share (tests/torch_test.cpp,
// tests/torch_backend_test.cpp): the checks of the tutorial programs' results (recomputed from the
// world size, never copied from a run), a job on two network-namespace hosts, drun with Debian's
// interpreter on one node. Header-only; include after catch.hpp. TwoHosts and singleNode take
// extra environment entries (TUTORIAL_BACKEND=drun, PYTHONPATH).
#pragma once

#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <set>

#include "netns.hpp"
#include "process.hpp"
#include "tagged_lines.hpp"
#include "torch_python.hpp"

namespace drun::test {

using namespace std::chrono_literals;

inline constexpr auto kJobTimeout = 120s;  // hang guard of one drun (torch imports take seconds each)

inline std::string seq(int n, const std::function<int(int)>& f) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(f(i));
  return s;
}

// Every tutorial's result on every rank of a job of `world` ranks; `out` is the stdout of all
// its drun agents together.
inline void checkTutorials(const std::string& out, int world) {
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

// One drun per host of a fresh namespace cluster, endpoint on host 0. Python is found on PATH,
// which puts Debian's interpreter first; gloo is told the hosts' interface (every namespace host
// shares this machine's hostname, which resolves to loopback: the seed's GLOO_SOCKET_IFNAME note).
struct TwoHosts {
  TwoHosts(std::vector<std::string> drunArgs, std::vector<std::string> program,
           std::vector<std::string> extraEnv = {})
      : cluster(2), args(std::move(drunArgs)), env(std::move(extraEnv)) {
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
    o.env.insert(o.env.end(), env.begin(), env.end());
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
  std::vector<std::string> env;
};

inline std::string describe(const std::vector<RunResult>& runs) {
  std::string all;
  for (size_t i = 0; i < runs.size(); ++i)
    all += "--- drun on host " + std::to_string(i) + ": " + runs[i].describe() + "\n";
  return all;
}

// drun with PYTHON_EXEC naming Debian's interpreter (`python3` on PATH may lack torch).
inline RunOptions singleNode(const MarkerScope& marker, std::vector<std::string> args,
                             std::vector<std::string> extraEnv = {}) {
  std::vector<std::string> env = {marker.env(), std::string("PYTHON_EXEC=") + kTorchPython,
                                  "OMP_NUM_THREADS=1"};
  env.insert(env.end(), extraEnv.begin(), extraEnv.end());
  return drunCommand(std::move(args), env, kJobTimeout);
}


// tutorials.py on two namespace hosts x 2 ranks, every result checked; `env`: the backend's.
inline void checkTutorialsOnTwoHosts(std::vector<std::string> env = {}) {
  TwoHosts job({"--nproc-per-node", "2"}, {"python3", torchProgram("tutorials.py").string()},
               std::move(env));
  auto runs = job.run();
  INFO(describe(runs));
  for (const auto& r : runs) REQUIRE(r.status() == 0);
  checkTutorials(runs[0].out + runs[1].out, 4);
  // Each host ran its own two ranks: node rank 0 (the endpoint's) ranks 0-1.
  for (const auto& l : tagged(runs[0].out, "TUTORIALS")) CHECK(l.rank() < 2);
  for (const auto& l : tagged(runs[1].out, "TUTORIALS")) CHECK(l.rank() >= 2);
  CHECK(job.marker.leftovers(5s).empty());
}

}  // namespace drun::test

#include <sched.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <set>

#include "drun/agent/numa_binding.hpp"
#include "drun/common/error.hpp"

using namespace drun::agent;

namespace {

// 2 sockets x 2 NUMA nodes x 8 cores, 2 threads a core (PUs 0-63 in order), two L3 caches of 4
// cores per node: node 0 = PUs 0-15, node 1 = 16-31 (socket 0), node 2 = 32-47, node 3 = 48-63.
const TopologySource kTwoSockets{std::filesystem::path(DRUN_SOURCE_DIR) / "tests" / "data" /
                                 "topology_2pkg_2numa_8core.xml"};

std::vector<int> range(int first, int last) {
  std::vector<int> out;
  for (int i = first; i <= last; ++i) out.push_back(i);
  return out;
}

std::vector<std::string> cpuLists(const NumaPlan& plan) {
  std::vector<std::string> out;
  for (const RankBinding& r : plan.ranks) out.push_back(describeList(r.cpus));
  return out;
}

}  // namespace

TEST_CASE("numa binding: the values of --numa-binding", "[agent][numa]") {
  CHECK(parseNumaMode("node") == NumaMode::Node);
  CHECK(parseNumaMode("socket") == NumaMode::Socket);
  CHECK(parseNumaMode("exclusive") == NumaMode::Exclusive);
  CHECK(parseNumaMode("core-complex") == NumaMode::CoreComplex);
  CHECK_FALSE(parseNumaMode("core_complex"));
  CHECK_FALSE(parseNumaMode(""));
  CHECK(std::string(toString(NumaMode::CoreComplex)) == "core-complex");
  CHECK(describeList({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
  CHECK(describeList({}) == "");
}

TEST_CASE("numa binding node: consecutive local ranks share a NUMA node", "[agent][numa]") {
  NumaPlan plan = planNumaBinding(NumaMode::Node, 8, kTwoSockets);
  CHECK(cpuLists(plan) == std::vector<std::string>{"0-15", "0-15", "16-31", "16-31", "32-47", "32-47",
                                                   "48-63", "48-63"});
  CHECK(plan.ranks[0].memNodes == std::vector<int>{0});
  CHECK(plan.ranks[3].memNodes == std::vector<int>{1});
  CHECK(plan.ranks[7].memNodes == std::vector<int>{3});
  CHECK_FALSE(plan.thisSystem);   // an XML topology is not this system's
  CHECK_FALSE(plan.bindsMemory);
  CHECK(plan.source == kTwoSockets.xml.string());

  // Fewer ranks than nodes: spread over them.
  CHECK(cpuLists(planNumaBinding(NumaMode::Node, 2, kTwoSockets)) == std::vector<std::string>{"0-15", "32-47"});
  // More ranks than CPUs per node is fine: they share the node.
  CHECK(planNumaBinding(NumaMode::Node, 40, kTwoSockets).ranks[39].cpus == range(48, 63));
}

TEST_CASE("numa binding socket: every CPU and node of the rank's socket", "[agent][numa]") {
  NumaPlan plan = planNumaBinding(NumaMode::Socket, 4, kTwoSockets);
  CHECK(cpuLists(plan) == std::vector<std::string>{"0-31", "0-31", "32-63", "32-63"});
  CHECK(plan.ranks[1].memNodes == std::vector<int>{0, 1});
  CHECK(plan.ranks[2].memNodes == std::vector<int>{2, 3});
}

TEST_CASE("numa binding exclusive: the node's cores split among its ranks", "[agent][numa]") {
  NumaPlan plan = planNumaBinding(NumaMode::Exclusive, 8, kTwoSockets);
  CHECK(cpuLists(plan) == std::vector<std::string>{"0-7", "8-15", "16-23", "24-31", "32-39", "40-47",
                                                   "48-55", "56-63"});
  CHECK(plan.ranks[5].memNodes == std::vector<int>{2});

  // 3 ranks a node, 8 cores: 3 + 3 + 2 cores, each core with both of its threads, none shared.
  plan = planNumaBinding(NumaMode::Exclusive, 12, kTwoSockets);
  CHECK(describeList(plan.ranks[0].cpus) == "0-5");
  CHECK(describeList(plan.ranks[1].cpus) == "6-11");
  CHECK(describeList(plan.ranks[2].cpus) == "12-15");
  CHECK(describeList(plan.ranks[11].cpus) == "60-63");
  std::set<int> seen;
  for (const RankBinding& r : plan.ranks)
    for (int cpu : r.cpus) CHECK(seen.insert(cpu).second);
  CHECK(seen.size() == 64);

  // 10 ranks on a node of 8 cores: no exclusive share for each.
  CHECK_THROWS_WITH(planNumaBinding(NumaMode::Exclusive, 40, kTwoSockets),
                    Catch::Contains("NUMA node 0") && Catch::Contains("has 8 cores for 10 local ranks"));
}

TEST_CASE("numa binding core-complex: one L3 group per rank on the node", "[agent][numa]") {
  NumaPlan plan = planNumaBinding(NumaMode::CoreComplex, 8, kTwoSockets);
  CHECK(cpuLists(plan) == std::vector<std::string>{"0-7", "8-15", "16-23", "24-31", "32-39", "40-47",
                                                   "48-55", "56-63"});
  // 4 ranks a node, 2 L3 groups: they take turns.
  plan = planNumaBinding(NumaMode::CoreComplex, 16, kTwoSockets);
  const std::vector<std::string> lists = cpuLists(plan);
  CHECK(std::vector<std::string>(lists.begin(), lists.begin() + 5) ==
        std::vector<std::string>{"0-7", "8-15", "0-7", "8-15", "16-23"});
  CHECK(plan.ranks[4].memNodes == std::vector<int>{1});
}

TEST_CASE("numa binding: a topology that cannot be read is named", "[agent][numa]") {
  CHECK_THROWS_WITH(planNumaBinding(NumaMode::Node, 2, {"/nonexistent/topo.xml"}),
                    Catch::Contains("/nonexistent/topo.xml") && Catch::Contains("--numa-binding"));
  const auto garbage = std::filesystem::temp_directory_path() / "drun_numa_garbage.xml";
  { std::FILE* f = std::fopen(garbage.c_str(), "w"); std::fputs("<topology><oops", f); std::fclose(f); }
  CHECK_THROWS_AS(planNumaBinding(NumaMode::Node, 2, {garbage}), drun::Error);
  std::filesystem::remove(garbage);
  CHECK(planNumaBinding(NumaMode::Off, 4, {"/nonexistent/topo.xml"}).ranks.empty());  // nothing read
  // HWLOC_XMLFILE, which hwloc itself would silently pass over when it cannot read it.
  ::setenv("HWLOC_XMLFILE", "/nonexistent/env.xml", 1);
  CHECK_THROWS_WITH(planNumaBinding(NumaMode::Node, 2),
                    Catch::Contains("the topology file /nonexistent/env.xml (HWLOC_XMLFILE) is not a readable file"));
  ::setenv("HWLOC_XMLFILE", kTwoSockets.xml.c_str(), 1);
  NumaPlan fromEnv = planNumaBinding(NumaMode::Node, 2);
  CHECK(fromEnv.source == kTwoSockets.xml.string() + " (HWLOC_XMLFILE)");
  CHECK(describeList(fromEnv.ranks[1].cpus) == "32-47");
  ::unsetenv("HWLOC_XMLFILE");
}

TEST_CASE("numa binding on this machine: within the CPUs drun may use", "[agent][numa]") {
  ::unsetenv("HWLOC_XMLFILE");
  cpu_set_t mine;
  REQUIRE(sched_getaffinity(0, sizeof mine, &mine) == 0);
  for (NumaMode mode : {NumaMode::Node, NumaMode::Socket, NumaMode::CoreComplex}) {
    NumaPlan plan = planNumaBinding(mode, 2);
    CHECK(plan.source == "this machine");
    CHECK(plan.thisSystem);
    REQUIRE(plan.ranks.size() == 2);
    for (const RankBinding& r : plan.ranks) {
      CHECK_FALSE(r.cpus.empty());
      CHECK_FALSE(r.memNodes.empty());
      for (int cpu : r.cpus) CHECK(CPU_ISSET(cpu, &mine));
    }
  }
  // exclusive: disjoint shares while there are cores enough.
  const int cores = CPU_COUNT(&mine);
  if (cores >= 2) {
    NumaPlan plan = planNumaBinding(NumaMode::Exclusive, 2);
    std::set<int> a(plan.ranks[0].cpus.begin(), plan.ranks[0].cpus.end());
    for (int cpu : plan.ranks[1].cpus) CHECK_FALSE(a.count(cpu));
  }
}

// End-to-end tests of torchrun 2.9-2.11's flags: --numa-binding on this machine, --virtual-local-rank
// and --duplicate-stdout-filters / --duplicate-stderr-filters, with build/bin/drun run as a user
// runs it (launcher_e2e_test.cpp says more about the harness). Synthetic topologies are
// agent_tests' (numa_binding_test.cpp): a worker cannot be bound to CPUs this machine lacks.
#include <sched.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <regex>
#include <set>

#include "drun/common/test_skip.hpp"

#include "launcher_e2e.hpp"
#include "process.hpp"

namespace fs = std::filesystem;
using namespace drun::test;
using namespace std::chrono_literals;

namespace {

// "0-2,5" -> {0, 1, 2, 5}
std::set<int> parseCpuList(const std::string& text) {
  std::set<int> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t comma = text.find(',', at);
    const std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    const size_t dash = item.find('-');
    const int first = std::stoi(item.substr(0, dash));
    const int last = dash == std::string::npos ? first : std::stoi(item.substr(dash + 1));
    for (int cpu = first; cpu <= last; ++cpu) out.insert(cpu);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

// Each rank's CPUs, as the kernel says in its /proc/self/status.
std::map<int, std::set<int>> cpusByRank(const std::string& out) {
  std::map<int, std::set<int>> cpus;
  for (const ConsoleLine& line : parseConsole(out)) {
    const std::string key = "Cpus_allowed_list:";
    if (line.text.rfind(key, 0) == 0) cpus[line.rank] = parseCpuList(line.text.substr(key.size()));
  }
  return cpus;
}

std::set<int> myCpus() {
  cpu_set_t mine;
  REQUIRE(::sched_getaffinity(0, sizeof mine, &mine) == 0);
  std::set<int> out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &mine)) out.insert(cpu);
  return out;
}

const std::vector<std::string> kShowCpus = {"/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status | tr -d '\\t '"};

}  // namespace

TEST_CASE("numa binding node on this machine: each worker within drun's CPUs", "[e2e]") {
  MarkerScope marker;
  const std::set<int> mine = myCpus();
  {
    auto r = run(drunCommand(concat({"--nproc-per-node", "2", "--numa-binding", "node", "-v"}, kShowCpus),
                             {marker.env()}));
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    auto cpus = cpusByRank(r.out);
    REQUIRE(cpus.size() == 2);
    for (auto& [rank, set] : cpus) {
      CHECK_FALSE(set.empty());
      for (int cpu : set) CHECK(mine.count(cpu));
    }
    CHECK(contains(r.err, "numa binding node on this machine: local rank 1: CPUs "));
  }
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("numa binding exclusive on this machine: no CPU shared between ranks", "[e2e]") {
  MarkerScope marker;
  if (myCpus().size() < 2) skipTest("exclusive binding of 2 ranks needs 2 CPUs");
  {
    auto r = run(drunCommand(concat({"--nproc-per-node", "2", "--numa-binding", "exclusive"}, kShowCpus),
                             {marker.env()}));
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    auto cpus = cpusByRank(r.out);
    REQUIRE(cpus.size() == 2);
    for (int cpu : cpus[0]) CHECK_FALSE(cpus[1].count(cpu));
  }
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("numa binding: an unknown mode is a usage error, an unreadable topology an error", "[e2e]") {
  MarkerScope marker;
  {
    auto r = run(drunCommand(concat({"--numa-binding", "cores"}, kShowCpus), {marker.env()}));
    INFO(r.describe());
    CHECK(r.status() == 2);
    CHECK(contains(r.err, "--numa-binding: expected node, socket, exclusive or core-complex, got 'cores'"));
  }
  // A topology hwloc cannot read, or another machine's: an error naming it, exit 1, no worker started.
  const fs::path synthetic = fs::path(DRUN_SOURCE_DIR) / "tests" / "data" / "topology_2pkg_2numa_8core.xml";
  for (const auto& [file, error] :
       std::vector<std::pair<std::string, std::string>>{
           {"/nonexistent/topology.xml", "the topology file /nonexistent/topology.xml (HWLOC_XMLFILE) is not a readable file"},
           {synthetic.string(), "the topology of " + synthetic.string() + " (HWLOC_XMLFILE) is not this machine's"}}) {
    auto r = run(drunCommand(concat({"--numa-binding", "node", "--nproc-per-node", "2"}, kShowCpus),
                             {marker.env(), "HWLOC_XMLFILE=" + file}));
    INFO(r.describe());
    CHECK(r.status() == 1);
    CHECK(contains(r.err, "drun: error: --numa-binding: " + error));
    CHECK_FALSE(contains(r.out, "Cpus_allowed_list"));
  }
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("virtual local rank: LOCAL_RANK=0 and each worker's own device, as torchrun", "[e2e]") {
  MarkerScope marker;
  // `visible`: CUDA_VISIBLE_DEVICES=LIST, or CUDA_VISIBLE_DEVICES (unset).
  auto virtualRanks = [&](int workers, const std::string& visible) {
    return run(drunCommand({"--nproc-per-node", std::to_string(workers), "--virtual-local-rank", envDump()},
                           {marker.env(), visible}));
  };
  auto r = virtualRanks(3, "CUDA_VISIBLE_DEVICES=2,5,GPU-7");
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  auto dumps = parseEnvDumps(r.out);
  REQUIRE(dumps.size() == 3);
  const char* devices[] = {"2", "5", "GPU-7"};
  for (int rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank);
    CHECK(dumps[rank].get("LOCAL_RANK") == "0");
    CHECK(dumps[rank].get("RANK") == std::to_string(rank));
    CHECK(dumps[rank].get("CUDA_VISIBLE_DEVICES") == devices[rank]);
  }
  auto unset = virtualRanks(2, "CUDA_VISIBLE_DEVICES");
  INFO(unset.describe());
  REQUIRE(unset.status() == 0);
  CHECK(parseEnvDumps(unset.out)[1].get("CUDA_VISIBLE_DEVICES") == "1");
  auto tooFew = virtualRanks(3, "CUDA_VISIBLE_DEVICES=0,1");
  INFO(tooFew.describe());
  CHECK(tooFew.status() == 2);
  CHECK(contains(tooFew.err, "names 2 device(s) for 3 local ranks"));
}

TEST_CASE("duplicate filters: filtered_*.log beside the rank logs", "[e2e]") {
  MarkerScope marker;
  TempDir logs;
  auto r = run(drunCommand({"--nproc-per-node", "2", "--log-dir", logs.path().string(), "--rdzv-id", "f1",
                            "--duplicate-stdout-filters", "loss,acc", "--duplicate-stderr-filters", "Error",
                            behave(), "out:step {rank}", "out:loss {rank}", "err:Error {rank}", "err:warn {rank}",
                            "out:acc {rank}"},
                           {marker.env()}));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  const fs::path attempt = logs.path() / "f1" / "node0" / "attempt_0";
  auto sorted = [](const std::string& text) {
    auto lines = splitLines(text);
    std::sort(lines.begin(), lines.end());
    return lines;
  };
  CHECK(sorted(slurp(attempt / "filtered_stdout.log")) ==
        std::vector<std::string>{"[0]:acc 0", "[0]:loss 0", "[1]:acc 1", "[1]:loss 1"});
  CHECK(sorted(slurp(attempt / "filtered_stderr.log")) == std::vector<std::string>{"[0]:Error 0", "[1]:Error 1"});
  CHECK(countLinesWith(r.out, "step") == 2);  // the console keeps everything

  // Without --log-dir: a kept directory, named on stderr, as with -r/-t.
  auto kept = run(drunCommand({"--duplicate-stdout-filters", "loss", behave(), "out:loss 9"}, {marker.env()}));
  INFO(kept.describe());
  REQUIRE(kept.status() == 0);
  std::smatch m;
  REQUIRE(std::regex_search(kept.err, m, std::regex("drun: log files go to (\\S+)")));
  const fs::path dir = m[1].str();
  CHECK(slurp(dir / "node0" / "attempt_0" / "filtered_stdout.log") == "loss 9\n");  // one worker: no prefix
  fs::remove_all(dir);
}

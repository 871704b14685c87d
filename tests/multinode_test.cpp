// Multi-node end-to-end tests: build/bin/drun on several "hosts" made of network namespaces
// (scripts/netns.sh via NetnsCluster), with the c10d rendezvous over real TCP between them: the
// endpoint host's agent embeds the store, the others connect. Skipped, with the reason, where
// namespaces cannot be made (not root, no `ip netns`).
//
// The worker (a small Python script) prints its place in the job and proves that MASTER_ADDR:
// MASTER_PORT is reachable from every host: worker rank 0 listens there (as torch's TCPStore or
// libdrun_comm would), every other rank connects to it and sends its rank.
#include <signal.h>

#include <catch2/catch.hpp>
#include <map>
#include <regex>
#include <set>

#include "drun/common/test_skip.hpp"
#include "netns.hpp"
#include "process.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

constexpr auto kJobTimeout = 40s;

const char* kPythonWorker = R"PY(
import os, socket, sys, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
print("MN rank=%d world=%d master=%s:%d group=%s groups=%s local=%s" % (
    rank, world, addr, port, os.environ["GROUP_RANK"], os.environ["GROUP_WORLD_SIZE"],
    os.environ["LOCAL_RANK"]), flush=True)
deadline = time.monotonic() + 20
if rank == 0:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(world)
    s.settimeout(20)
    got = []
    while len(got) < world - 1:
        c, _ = s.accept()
        got.append(int(c.recv(16).decode()))
        c.close()
    print("MN master heard " + ",".join(str(r) for r in sorted(got)), flush=True)
else:
    while True:  # rank 0 may not listen yet: retry until the deadline
        try:
            c = socket.create_connection((addr, port), timeout=2)
            c.sendall(str(rank).encode())
            c.close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
)PY";

struct WorkerLine {
  int rank, world, group, groups, local;
  std::string master;
};

// The "MN rank=..." lines of one drun's output.
std::vector<WorkerLine> workerLines(const std::string& out) {
  static const std::regex re(
      R"(MN rank=(\d+) world=(\d+) master=(\S+) group=(\d+) groups=(\d+) local=(\d+))");
  std::vector<WorkerLine> lines;
  for (const auto& l : parseConsole(out)) {
    std::smatch m;
    if (std::regex_search(l.text, m, re))
      lines.push_back({std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[4]), std::stoi(m[5]),
                       std::stoi(m[6]), m[3]});
  }
  return lines;
}

// One job over a fresh cluster: `drun <drunArgs> python3 worker.py` on any host, endpoint on
// host 0, a run id of its own, every process carrying the marker.
struct Job {
  Job(int hosts, const std::string& nnodes, int perNode, std::vector<std::string> extra = {})
      : cluster(hosts), worker(dir.write("worker.py", kPythonWorker).string()) {
    drunArgs = {"--nnodes", nnodes, "--nproc-per-node", std::to_string(perNode),
                "--rdzv-endpoint", cluster.address(0) + ":29400", "--rdzv-id", "mn-" + randomHex(8)};
    drunArgs.insert(drunArgs.end(), extra.begin(), extra.end());
  }

  RunOptions on(int host, std::vector<std::string> env = {}) const {
    std::vector<std::string> argv = {drunPath().string()};
    argv.insert(argv.end(), drunArgs.begin(), drunArgs.end());
    argv.push_back("/usr/bin/python3");
    argv.push_back(worker);
    RunOptions o;
    o.argv = cluster.exec(host, argv);
    o.env = std::move(env);
    o.env.push_back(marker.env());
    o.env.push_back("OMP_NUM_THREADS=1");
    o.timeout = kJobTimeout;
    return o;
  }

  NetnsCluster cluster;
  MarkerScope marker;
  TempDir dir;
  std::string worker;
  std::vector<std::string> drunArgs;  // between drun and the worker
};

// One job's results over all its hosts: every global rank once, one world, one master that all
// ranks reached, node ranks consistent within each host.
void checkJob(const std::vector<RunResult>& runs, int nodes, int perNode) {
  const int world = nodes * perNode;
  std::multiset<int> ranks;
  std::set<std::string> masters;
  std::set<int> groups;
  std::string heard;
  for (const auto& r : runs) {
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    auto lines = workerLines(r.out);
    REQUIRE(static_cast<int>(lines.size()) == perNode);
    std::set<int> groupOfHost;
    for (const auto& w : lines) {
      ranks.insert(w.rank);
      masters.insert(w.master);
      groupOfHost.insert(w.group);
      CHECK(w.world == world);
      CHECK(w.groups == nodes);
      CHECK(w.rank == w.group * perNode + w.local);
    }
    CHECK(groupOfHost.size() == 1);
    groups.insert(*groupOfHost.begin());
    if (auto at = r.out.find("MN master heard "); at != std::string::npos)
      heard = r.out.substr(at + 16, r.out.find('\n', at) - at - 16);
  }
  CHECK(static_cast<int>(ranks.size()) == world);
  CHECK(std::set<int>(ranks.begin(), ranks.end()).size() == ranks.size());
  CHECK(*ranks.rbegin() == world - 1);
  CHECK(static_cast<int>(groups.size()) == nodes);
  CHECK(masters.size() == 1);
  std::string expectHeard;
  for (int r = 1; r < world; ++r) expectHeard += (r > 1 ? "," : "") + std::to_string(r);
  CHECK(heard == expectHeard);  // rank 0 heard every other rank at MASTER_ADDR:MASTER_PORT
}


}  // namespace

TEST_CASE("multinode: 2 hosts x 4 workers form one job and MASTER_ADDR is reachable from both",
          "[multinode]") {
  skipWithoutNetns("multi-node test");
  Job job(2, "2", 4);
  Process host0(job.on(0));
  Process host1(job.on(1));
  std::vector<RunResult> runs = {host0.wait(), host1.wait()};
  checkJob(runs, 2, 4);
  // MASTER_ADDR is node rank 0's address as the other host reaches it.
  auto master = workerLines(runs[0].out).at(0).master;
  CHECK((master.rfind(job.cluster.address(0) + ":", 0) == 0 ||
         master.rfind(job.cluster.address(1) + ":", 0) == 0));
  CHECK(job.marker.leftovers(5s).empty());
}

TEST_CASE("multinode: --nnodes 2:3 with two hosts closes after the last call", "[multinode]") {
  skipWithoutNetns("multi-node test");
  Job job(2, "2:3", 2, {"--rdzv-conf", "last_call_timeout=1"});
  Process host0(job.on(0));
  Process host1(job.on(1));
  std::vector<RunResult> runs = {host0.wait(), host1.wait()};
  checkJob(runs, 2, 2);
  CHECK(runs[1].wall >= 1s);  // it waited for a third host for the last call
  CHECK(job.marker.leftovers(5s).empty());
}

TEST_CASE("multinode: an agent SIGKILLed during the join does not hang the others",
          "[multinode]") {
  skipWithoutNetns("multi-node test");
  Job job(3, "2:3", 2, {"--rdzv-conf", "last_call_timeout=1"});
  const std::vector<std::string> debug = {"DRUN_LOG_LEVEL=debug"};
  auto joined = [](const std::string&, const std::string& err) {
    return err.find("joined round 0 as arrival") != std::string::npos;
  };
  Process host0(job.on(0, debug));
  REQUIRE(host0.waitForOutput(joined, 20s));
  Process victim(job.on(2, debug));
  REQUIRE(victim.waitForOutput(joined, 20s));
  victim.signal(SIGKILL);  // its connection closes: its will marks it dead in round 0
  auto killed = victim.wait();
  CHECK(killed.signal == SIGKILL);
  CHECK(workerLines(killed.out).empty());

  Process host1(job.on(1));
  std::vector<RunResult> runs = {host0.wait(), host1.wait()};
  checkJob(runs, 2, 2);  // two nodes: the dead one is not counted
  CHECK(job.marker.leftovers(5s).empty());
}

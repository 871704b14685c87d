// An etcd cluster that loses its quorum under a running job and gets it back well within the
// lease TTL (drun with --rdzv-backend etcd on a private 3-member cluster, scripts/etcd/up.sh;
// SKIPPED without etcd): the agents' calls and lease renewals wait for the quorum, no agent takes
// its lease for lost (that takes 3/4 of the TTL without a renewal), so nothing is noticed and the
// workers keep running: the same PIDs before and after, no restart spent.
#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <regex>
#include <thread>

#include "../rendezvous/etcd/tests/etcd_cluster.hpp"
#include "process.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

// The argv of an agent of a 2-node job on `etcd`: lease TTL 8 s (a lease is taken for lost
// after 6 s without a renewal), reconnect_timeout 8 s.
std::vector<std::string> quorumAgent(const EtcdCluster& etcd, const std::string& id,
                                     std::vector<std::string> program) {
  std::vector<std::string> args = {"--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "3",
                                   "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.list(), "--rdzv-id", id,
                                   "--rdzv-conf",
                                   "heartbeat_timeout=8,reconnect_timeout=8,join_timeout=20,last_call_timeout=0"};
  args.insert(args.end(), program.begin(), program.end());
  return args;
}

// Every "RUN count=C pid=P" line a worker of the agent printed, in order.
std::vector<std::string> workerRuns(const std::string& out) {
  const std::regex line("RUN count=\\d+ pid=\\d+");
  std::vector<std::string> runs;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator(); ++it)
    runs.push_back(it->str());
  return runs;
}

}  // namespace

TEST_CASE("etcd quorum: a quorum lost for 3 s under a running job and back keeps the same workers "
          "running, no restart spent",
          "[e2e][etcd]") {
  EtcdCluster etcd;
  MarkerScope marker;
  TempDir marks;
  const std::string id = "etcd-quorum-back-" + randomHex(6);
  // Each worker prints its restart count and PID, then runs until $MARKS/go (bounded: 60 s).
  const std::vector<std::string> program = {
      "sh", "-c",
      "echo RUN count=$TORCHELASTIC_RESTART_COUNT pid=$$; "
      "for i in $(seq 6000); do [ -e $MARKS/go ] && exit 0; sleep 0.01; done; exit 9"};
  const std::string marksEnv = "MARKS=" + marks.path().string();
  Process a(drunCommand(quorumAgent(etcd, id, program), {marker.env(), marksEnv}, 90s));
  Process b(drunCommand(quorumAgent(etcd, id, program), {marker.env(), marksEnv}, 90s));
  REQUIRE(a.waitForLines("RUN count=0", 1, 30s));
  REQUIRE(b.waitForLines("RUN count=0", 1, 30s));
  // Two of three members frozen, the first listed among them (the agents' calls go there first):
  // no leader, no quorum; nothing answers a write, a lease renewal or a linearizable read. 3 s:
  // less than 3/4 of the TTL (6 s) however long before the freeze the last renewal came (a
  // third of the TTL at most).
  etcd.signal(0, SIGSTOP);
  etcd.signal(1, SIGSTOP);
  std::this_thread::sleep_for(3s);
  etcd.signal(0, SIGCONT);
  etcd.signal(1, SIGCONT);
  // Time for an agent that took the outage for a loss to stop and restart its workers (a second
  // RUN line).
  std::this_thread::sleep_for(10s);
  std::ofstream(marks.path() / "go").put('\n');
  const RunResult ra = a.wait(40s), rb = b.wait(40s);
  INFO(ra.describe() << "\n" << rb.describe());
  for (const RunResult* r : {&ra, &rb}) {
    CHECK_FALSE(r->timedOut);
    CHECK(r->status() == 0);
    CHECK_THAT(r->err, !Catch::Contains("lost the rendezvous store"));
    // One worker run each: the PID before the outage is the one that ended; count 0 throughout.
    const auto runs = workerRuns(r->out);
    CHECK(runs.size() == 1);
    for (const auto& run : runs) CHECK_THAT(run, Catch::StartsWith("RUN count=0 "));
  }
  CHECK(marker.leftovers(5s).empty());
}

// Point to point across transports (tests/comm_p2p_worker.cpp): pairs of ranks with tags in
// mixed orders and receives from any source, on one host (shm, tcp) and on two namespace hosts
// (hierarchical: peers on the same host over shared memory, the others over Gloo; a receive from
// any source listens on both); and a rank SIGKILLed with receives pending on it.
#include <catch2/catch.hpp>

#include <csignal>
#include <memory>
#include <string>

#include "drun/common/test_skip.hpp"
#include "drun/rendezvous/port_reservation.hpp"
#include "netns.hpp"
#include "process.hpp"
#include "comm_jobs.hpp"

using namespace drun::test;

namespace {

void requireOk(const std::string& out, int n) {
  for (int k = 0; k < n; ++k) CHECK(out.find("rank " + std::to_string(k) + ": ok") != std::string::npos);
}

}  // namespace

TEST_CASE("comm: point to point on one host: pairs with tags in mixed orders, any source", "[comm]") {
  for (const char* transport : {"shm", "tcp"}) {
    DYNAMIC_SECTION(transport) {
      MarkerScope marker;
      auto r = run(drunCommand({"--standalone", "--nproc-per-node", "3", helperPath("comm_p2p_worker").string(), "p2p"},
                               {marker.env(), "DRUN_COMM_TRANSPORT=" + std::string(transport)}, 90s));
      INFO(r.describe());
      REQUIRE_FALSE(r.timedOut);
      CHECK(r.exitCode == 0);
      requireOk(r.out, 3);
    }
  }
}

// 2 hosts x 2 and x 3: every pair (local and remote), every size to 1 MiB+, any source mixing
// local and remote senders, given sources first or not; the timeout of a receive from a remote
// rank names it.
TEST_CASE("comm: two hosts: point to point to local and remote peers, from any source", "[comm][slow][multinode]") {
  if (auto why = NetnsCluster::unavailableReason()) skipTest("hierarchical p2p test: " + *why);
  for (int perHost : {2, 3}) {
    DYNAMIC_SECTION(perHost << " ranks per host") {
      NetnsCluster cluster(2);
      MarkerScope marker;
      const std::string out =
          runTwoHostJob(cluster, marker, perHost, {helperPath("comm_p2p_worker").string(), "p2p"}, 120s);
      INFO(out);
      requireOk(out, 2 * perHost);
      for (int k = 0; k < 2 * perHost; ++k)
        CHECK(out.find("rank " + std::to_string(k) + ": transport hierarchical") != std::string::npos);
    }
  }
}

// Ranks started directly in the namespaces (no agent to stop the survivors): rank 3 is remote to
// ranks 0 and 1 and local to rank 2; rank 1 local to 0 and remote to 2 and 3.
TEST_CASE("comm: two hosts: a SIGKILLed rank fails receives pending on it (given or any source), naming it",
          "[comm][slow][multinode]") {
  if (auto why = NetnsCluster::unavailableReason()) skipTest("hierarchical p2p victim test: " + *why);
  for (int victim : {3, 1}) {
    DYNAMIC_SECTION("victim " << victim) {
      NetnsCluster cluster(2);
      MarkerScope marker;
      std::vector<std::unique_ptr<Process>> ranks;
      for (int r = 0; r < 4; ++r) {
        RunOptions o;
        o.argv = cluster.exec(r / 2, {helperPath("comm_p2p_worker").string(), "victim-p2p", std::to_string(victim)});
        o.env = {marker.env(), "MASTER_ADDR=" + cluster.address(0), "MASTER_PORT=29500", "RANK=" + std::to_string(r),
                 "WORLD_SIZE=4", "LOCAL_RANK=" + std::to_string(r % 2), "LOCAL_WORLD_SIZE=2", "DRUN_COMM_TRANSPORT=auto"};
        o.timeout = 60s;
        ranks.push_back(std::make_unique<Process>(o));
      }
      checkVictimJob(ranks, victim, {"pending receive from the victim NAMED", "pending receive from any rank NAMED"});
    }
  }
}

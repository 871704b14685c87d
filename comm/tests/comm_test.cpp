// Multi-process tests: comm_worker and the examples as users run them, under build/bin/drun, and
// a peer SIGKILLed mid-collective (ranks started directly, so that no agent stops the survivors).
#include <catch2/catch.hpp>

#include <csignal>
#include <memory>
#include <string>

#include "drun/rendezvous/port_reservation.hpp"
#include "process.hpp"

using namespace drun::test;

namespace {

RunResult drunRun(int nproc, const std::string& program, std::vector<std::string> args,
                  std::chrono::milliseconds timeout, const MarkerScope& marker) {
  std::vector<std::string> argv = {"--standalone", "--nproc-per-node", std::to_string(nproc), program};
  for (auto& a : args) argv.push_back(std::move(a));
  return run(drunCommand(argv, {marker.env(), "OMP_NUM_THREADS=1"}, timeout));
}

void requireAllRanks(const RunResult& r, int n, const std::string& needle) {
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.exitCode == 0);
  for (const auto& line : parseConsole(r.out)) INFO(line.text);
  for (int k = 0; k < n; ++k)
    CHECK(r.out.find("rank " + std::to_string(k) + needle) != std::string::npos);
}

}  // namespace

// World sizes 1..3 run the whole matrix (1 MiB+ for every reduce op); 4 and 7 (oversubscribed on
// two cores) run it with 64 KiB+ for the non-sum ops.
TEST_CASE("every op, dtype, reduce op and size matches the local reference", "[comm][slow]") {
  for (int n : {1, 2, 3, 4, 7}) {
    DYNAMIC_SECTION("world " << n) {
      MarkerScope marker;
      std::vector<std::string> args = {"matrix"};
      if (n >= 4) args.push_back("--quick");
      auto r = drunRun(n, helperPath("comm_worker").string(), args, 90s, marker);
      requireAllRanks(r, n, ": ok");
    }
  }
}

TEST_CASE("a peer SIGKILLed mid-collective fails every survivor with its name, in time", "[comm][slow]") {
  for (int n : {2, 4}) {
    for (int victim : {0, n - 1}) {  // rank 0 also hosts the store
      DYNAMIC_SECTION("world " << n << " victim " << victim) {
        auto port = drun::rdzv::PortReservation::reserve("127.0.0.1");
        MarkerScope marker;
        std::vector<std::unique_ptr<Process>> ranks;
        for (int r = 0; r < n; ++r) {
          RunOptions o;
          o.argv = {helperPath("comm_worker").string(), "victim", std::to_string(victim)};
          o.env = {marker.env(), "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port.port()),
                   "RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(n), "LOCAL_RANK=0"};
          o.timeout = 30s;
          ranks.push_back(std::make_unique<Process>(o));
        }
        for (int r = 0; r < n; ++r) {
          RunResult res = ranks[r]->wait();
          INFO("rank " << r << ": " << res.describe());
          REQUIRE_FALSE(res.timedOut);
          if (r == victim) {
            CHECK(res.signal == SIGKILL);
          } else {
            CHECK(res.exitCode == 0);
            CHECK(res.out.find("NAMED") != std::string::npos);
          }
        }
      }
    }
  }
}

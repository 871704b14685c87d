// Jobs of the comm tests' workers, shared by the test files (header-only; one test thread):
//   runTwoHostJob     a drun job on two "hosts" (network namespaces of a NetnsCluster) x perHost
//                     ranks, one drun per host rendezvousing on host 0; returns both hosts'
//                     output, REQUIREs that neither timed out and CHECKs that both ended with 0
//   checkVictimJob    ranks started directly, one of which SIGKILLs itself: it died of SIGKILL,
//                     every other ended with 0 and printed each of `survivorLines`
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include "netns.hpp"
#include "process.hpp"

namespace drun::test {

inline std::string runTwoHostJob(const NetnsCluster& cluster, const MarkerScope& marker, int perHost,
                                 const std::vector<std::string>& worker, std::chrono::milliseconds timeout) {
  const std::string id = "hier-" + randomHex(8);
  std::vector<std::unique_ptr<Process>> hosts;
  for (int h = 0; h < 2; ++h) {
    RunOptions o;
    std::vector<std::string> argv = {drunPath().string(), "--nnodes", "2", "--nproc-per-node", std::to_string(perHost),
                                     "--rdzv-endpoint", cluster.address(0) + ":29400", "--rdzv-id", id};
    argv.insert(argv.end(), worker.begin(), worker.end());
    o.argv = cluster.exec(h, argv);
    o.env = {marker.env(), "OMP_NUM_THREADS=1"};
    o.timeout = timeout;
    hosts.push_back(std::make_unique<Process>(o));
  }
  std::string out;
  for (auto& h : hosts) {
    RunResult r = h->wait();
    INFO(r.describe());
    REQUIRE_FALSE(r.timedOut);
    CHECK(r.exitCode == 0);
    out += r.out;
  }
  return out;
}

inline void checkVictimJob(std::vector<std::unique_ptr<Process>>& ranks, int victim,
                           const std::vector<std::string>& survivorLines) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    RunResult res = ranks[r]->wait();
    INFO("rank " << r << ": " << res.describe());
    REQUIRE_FALSE(res.timedOut);
    if (static_cast<int>(r) == victim) {
      CHECK(res.signal == SIGKILL);
      continue;
    }
    CHECK(res.exitCode == 0);
    for (const auto& line : survivorLines) CHECK(res.out.find(line) != std::string::npos);
  }
}

}  // namespace drun::test

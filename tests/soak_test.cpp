// Soak: a job that fails and restarts 300 times in a row. The agent's (and the embedded store
// server's) open file descriptors must not grow at all and its memory only within allocator noise;
// nothing may be left behind. Each round rank 0 of a node records its agent's fds and VmRSS
// (behave agentstat), so the figures come from inside the running job.
#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <sstream>

#include "process.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

constexpr int kRestarts = 300;
constexpr int kFdNoise = 3;

struct Sample {
  int fds = 0;
  long rssKb = 0;
};

// restart -> sample, from a file of "<restart> <fds> <rss kB>" lines.
std::map<int, Sample> readSamples(const std::filesystem::path& file) {
  std::map<int, Sample> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    int restart = 0;
    Sample s;
    if (fields >> restart >> s.fds >> s.rssKb) out[restart] = s;
  }
  return out;
}

// Checks one agent's samples: every round seen; the most fds open in the last 50 rounds at most
// kFdNoise more than in rounds 10-59 (a sample catches the round's transient fds, worker pipes
// mid-spawn, so samples vary by a few; a leak of one per round would add 250); memory growth
// bounded.
// Prints the figures for the closing note.
void checkFlat(const std::map<int, Sample>& samples, const std::string& who) {
  REQUIRE(samples.size() == kRestarts + 1);
  auto maxFds = [&](int from, int to) {
    int most = 0;
    for (int r = from; r < to; ++r) most = std::max(most, samples.at(r).fds);
    return most;
  };
  const int earlyFds = maxFds(10, 60), lateFds = maxFds(kRestarts - 49, kRestarts + 1);
  const long earlyRss = samples.at(10).rssKb, lateRss = samples.at(kRestarts).rssKb;
  WARN(who << ": rounds 10-59: at most " << earlyFds << " fds, " << earlyRss << " kB at round 10; rounds "
            << kRestarts - 49 << "-" << kRestarts << ": at most " << lateFds << " fds, " << lateRss
            << " kB at round " << kRestarts);
  CHECK(lateFds <= earlyFds + kFdNoise);
  if (!kSanitizedBuild) CHECK(lateRss - earlyRss < 4096);  // process.hpp says why
}

}  // namespace

TEST_CASE("soak: a single-node job restarts 300 times without growing", "[e2e][soak]") {
  MarkerScope marker;
  TempDir dir;
  const auto stats = dir.path() / "agent";
  auto r = run(drunCommand({"--nproc-per-node", "2", "--max-restarts", std::to_string(kRestarts),
                            helperPath("behave").string(), "agentstat:" + stats.string() + "@rank=0",
                            // rank 1 fails only once rank 0 has recorded this round
                            "touch:" + (dir.path() / "stat{restart}").string() + "@rank=0",
                            "await:" + (dir.path() / "stat{restart}").string() + "@rank=1",
                            "exit:1@rank=1@restart!=" + std::to_string(kRestarts)},
                           {marker.env()}, 240s));
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  checkFlat(readSamples(stats), "single-node agent");
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("soak: a two-node job restarts 300 times and neither agent nor the store grows",
          "[e2e][soak]") {
  MarkerScope marker;
  TempDir dir;
  const uint16_t port = freeLoopbackPort();
  const std::string id = "soak-" + randomHex(6);
  auto agent = [&] {
    return drunCommand({"--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint",
                        "127.0.0.1:" + std::to_string(port), "--rdzv-id", id, "--max-restarts",
                        std::to_string(kRestarts), helperPath("behave").string(),
                        "agentstat:" + (dir.path() / "node{rank}").string() + "@rank=0,2",
                        // rank 3 fails only once both nodes have recorded this round
                        "touch:" + (dir.path() / "stat{rank}.{restart}").string() + "@rank=0,2",
                        "await:" + (dir.path() / "stat0.{restart}").string() + "@rank=3",
                        "await:" + (dir.path() / "stat2.{restart}").string() + "@rank=3",
                        "exit:1@rank=3@restart!=" + std::to_string(kRestarts)},
                       {marker.env()}, 240s);
  };
  Process a(agent()), b(agent());
  RunResult ra = a.wait(), rb = b.wait();
  INFO(ra.describe() << "\n" << rb.describe());
  REQUIRE_FALSE(ra.timedOut);
  REQUIRE_FALSE(rb.timedOut);
  CHECK(ra.status() == 0);
  CHECK(rb.status() == 0);
  // One of the two agents hosts the store server: its figures cover the server too.
  checkFlat(readSamples(dir.path() / "node0"), "node 0 agent");
  checkFlat(readSamples(dir.path() / "node2"), "node 1 agent");
  CHECK(marker.leftovers(5s).empty());
}

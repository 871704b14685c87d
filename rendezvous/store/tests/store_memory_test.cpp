// The drun-rendezvous daemon's memory under memory-exhaustion attacks, with small budgets: watches
// whose `known` is a large value (the server keeps a digest), large sets until the job's share and
// the total are spent, many blocking calls with long key lists on many connections, a large will.
// Each over-budget request is refused naming its option; the daemon's resident memory stays
// under the bound docs/protocol.md states for those budgets, and a fresh client is served.
#include <catch2/catch.hpp>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "drun/common/error.hpp"
#include "server_test_support.hpp"

using namespace drun::rdzv;
using namespace drun::rdzv::test;

namespace {

constexpr size_t kMiB = 1u << 20;
// The budgets the daemon runs with here, and the bound they give (docs/protocol.md, "Limits"):
// base + maxStoredBytes + 2 x maxInputBytes + maxOutputBytes + maxCallBytes + 3 x maxFrameBytes
// + connections x 16 KiB.
constexpr size_t kStored = 64 * kMiB, kPerJob = 32 * kMiB, kCalls = 32 * kMiB,
                 kCallsPerConnection = 8 * kMiB, kInput = 64 * kMiB, kOutput = 64 * kMiB,
                 kFrame = 64 * kMiB;
constexpr size_t kConnections = 64;
constexpr size_t kBound = kStored + 2 * kInput + kOutput + kCalls + 3 * kFrame + kConnections * 16 * 1024;

std::vector<std::string> budgetFlags() {
  return {"--max-stored-bytes", "64M", "--max-stored-bytes-per-job", "32M", "--max-call-bytes", "32M",
          "--max-call-bytes-per-connection", "8M", "--max-input-bytes", "64M",
          "--max-output-bytes", "64M"};
}

// Samples the daemon's RSS until stopped; the peak.
class PeakSampler {
 public:
  explicit PeakSampler(const DaemonProcess& daemon)
      : thread_([this, &daemon] {
          while (!stop_) {
            peak_ = std::max<size_t>(peak_, daemon.residentBytes());
            std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the sampling period
          }
        }) {}
  ~PeakSampler() { finish(); }
  size_t finish() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return peak_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<size_t> peak_{0};
  std::thread thread_;
};

// Clients that outlive the test's slow phases: a lease of a minute.
std::unique_ptr<RawClient> longLeaseClient(uint16_t port) { return admitted(port, 60'000); }

// Reads responses until none comes for `quiet`; counts those whose message names `limit`.
int refusalsNaming(RawClient& c, const std::string& limit, std::chrono::milliseconds quiet) {
  int n = 0;
  while (auto p = c.response(quiet))
    if (p->status == wire::Status::InvalidArgument && p->message.find(limit) != std::string::npos) ++n;
  return n;
}

}  // namespace

TEST_CASE("daemon memory: large known values, large sets, many waiters and a large will stay "
          "under the stated bound", "[server][limits][slow]") {
  DaemonProcess daemon(budgetFlags());
  TcpStore setter(clientOptions(daemon.port()));
  const size_t start = daemon.residentBytes();
  PeakSampler sampler(daemon);
  INFO("RSS at start " << start / kMiB << " MiB; bound " << kBound / kMiB << " MiB above it");

  // 1. Watches whose `known` is the stored 4 MiB value: 8 connections x 32 (1 GiB of `known`).
  const std::string big(4 * kMiB, 'k');
  setter.set("atk/big", big);
  {
    std::vector<std::unique_ptr<RawClient>> watchers;
    for (int c = 0; c < 8; ++c) {
      watchers.push_back(longLeaseClient(daemon.port()));
      for (uint64_t id = 1; id <= 32; ++id) {
        wire::Request w = request(wire::Op::Watch, {"atk/big"}, id, 60000);
        w.known = big;
        watchers.back()->request(w);
      }
      watchers.back()->request(request(wire::Op::TryGet, {"atk/none"}, 99));
      auto p = watchers.back()->response(20s);  // the watches before it were all taken in
      REQUIRE(p);
      CHECK(p->id == 99);
    }
    if (kRssIsMeaningful) CHECK(daemon.residentBytes() < start + kBound);
  }

  // 2. Large sets: a job's share (32 MiB), then the total (64 MiB).
  int perJobRefusals = 0, totalRefusals = 0, stored = 0;
  for (int job = 0; job < 4; ++job) {
    for (int i = 0; i < 10; ++i) {
      try {
        setter.set("rdzv/atk" + std::to_string(job) + "/" + std::to_string(i), big);
        ++stored;
      } catch (const drun::InvalidArgument& e) {
        const std::string what = e.what();
        perJobRefusals += what.find("maxStoredBytesPerJob") != std::string::npos;
        totalRefusals += what.find("maxStoredBytes ") != std::string::npos;
      }
    }
  }
  CHECK(stored < 16);  // 64 MiB / 4 MiB, with atk/big and the entries' overhead
  CHECK(perJobRefusals >= 2);
  CHECK(totalRefusals >= 10);

  // 3. Many waiters on many connections: 16 x 256 waits on 64 keys of 1 KiB each.
  {
    std::vector<std::unique_ptr<RawClient>> waiters;
    std::vector<std::string> keys;
    for (int k = 0; k < 64; ++k) keys.push_back("atk/never/" + std::to_string(k) + std::string(1000, 'x'));
    for (int c = 0; c < 16; ++c) {
      waiters.push_back(longLeaseClient(daemon.port()));
      for (uint64_t id = 1; id <= 256; ++id)
        waiters.back()->request(request(wire::Op::Wait, keys, id, 60000));
    }
    int perConnection = 0, total = 0;
    for (auto& w : waiters) {
      perConnection += refusalsNaming(*w, "maxCallBytesPerConnection", 300ms);
    }
    // Refusals name one limit or the other; count the total's separately on fresh connections.
    auto late = longLeaseClient(daemon.port());
    late->request(request(wire::Op::Wait, keys, 1, 60000));
    total = refusalsNaming(*late, "maxCallBytes ", 300ms);
    CHECK(perConnection > 0);
    CHECK(total == 1);

    // 4. A will of 12 MiB on one connection (over its 8 MiB).
    auto willer = longLeaseClient(daemon.port());
    wire::Request will = request(wire::Op::SetWill, {}, 1);
    for (int i = 0; i < 3; ++i) will.will.sets.emplace_back("atk/will/" + std::to_string(i), big);
    willer->request(will);
    CHECK(refusalsNaming(*willer, "maxCallBytesPerConnection", 300ms) == 1);
    if (kRssIsMeaningful) CHECK(daemon.residentBytes() < start + kBound);
  }

  const size_t peak = sampler.finish();
  checkServes(clientOptions(daemon.port()));
  const size_t after = daemon.residentBytes();
  INFO("RSS before " << start / 1024 << " KiB, peak " << peak / 1024 << " KiB, after " << after / 1024
                     << " KiB");
  if (kRssIsMeaningful) {
    CHECK(peak < start + kBound);
    CHECK(after < start + kBound);
  }
  CHECK(daemon.stop() == 0);
}

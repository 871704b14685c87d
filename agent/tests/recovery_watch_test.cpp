// RecoveryWatch (recovery_watch.hpp): every generation that begins is reported, in order, with its
// lost ranks, restart count and world record, even when several begin between two looks of the
// watch (two resizes published back to back): an agent renumbers its place through each world
// record in turn, so none may be skipped.
#include <catch2/catch.hpp>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "drun/rendezvous/recovery_keys.hpp"
#include "drun/store/memory_store.hpp"
#include "drun/store/store_batch.hpp"
#include "recovery_watch.hpp"

using namespace std::chrono_literals;
using drun::agent::detail::Generation;
using drun::agent::detail::RecoveryWatch;
using drun::rdzv::MemoryStore;
namespace keys = drun::rdzv::recovery;

namespace {

const std::string kPrefix = "rdzv/job/0/workers/";

// The reports of a watch, collected under a lock.
struct Reports {
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Generation> began;
  std::vector<uint64_t> decided;
  std::string failure;  // the watch's failure, if any

  RecoveryWatch::Handlers handlers(MemoryStore& store) {
    RecoveryWatch::Handlers h;
    h.connect = [&store] { return store.clone(); };
    h.began = [this](const Generation& g) {
      std::lock_guard lock(mutex);
      began.push_back(g);
      changed.notify_all();
    };
    h.decided = [this](uint64_t g, const std::string&) {
      std::lock_guard lock(mutex);
      decided.push_back(g);
      changed.notify_all();
    };
    h.failed = [this](const std::string& what) {
      std::lock_guard lock(mutex);
      failure = what;
    };
    return h;
  }
  // The generations reported begun once `n` were, or by the bound.
  std::vector<uint64_t> beganWithin(size_t n, std::chrono::milliseconds bound) {
    std::unique_lock lock(mutex);
    changed.wait_for(lock, bound, [&] { return began.size() >= n; });
    std::vector<uint64_t> out;
    for (const Generation& g : began) out.push_back(g.number);
    return out;
  }
  bool decidedWithin(uint64_t g, std::chrono::milliseconds bound) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, bound, [&] { return std::find(decided.begin(), decided.end(), g) != decided.end(); });
  }
};

// Generation g begins with `world` (a shrink or a grow), as its opener writes it.
void begin(MemoryStore& store, uint64_t g, const keys::World& world, int restartCount) {
  store.set(keys::world(kPrefix, g), keys::encodeWorld(world));
  store.set(keys::restartCount(kPrefix, g), std::to_string(restartCount));
  store.set(keys::generation(kPrefix), std::to_string(g));
}

}  // namespace

TEST_CASE("recovery watch: two generations begun before the watch looks are both reported, in order, each "
          "with its own world record",
          "[agent][recovery]") {
  MemoryStore store;
  // A shrink (node 1 of 3 dropped), then a grow of the shrunk world: back to back.
  begin(store, 1, {{0, 1, 4, 5}, {0, 2}}, 1);
  begin(store, 2, {{0, 1, 2, 3}, {0, 1}, 2, 1}, 1);
  Reports reports;
  RecoveryWatch watch(kPrefix, reports.handlers(store), 200ms);
  const std::vector<uint64_t> began = reports.beganWithin(2, 5s);
  REQUIRE(began == std::vector<uint64_t>{1, 2});
  std::lock_guard lock(reports.mutex);
  REQUIRE(reports.began[0].world.has_value());
  CHECK(reports.began[0].world->ranks == std::vector<int>{0, 1, 4, 5});
  CHECK_FALSE(reports.began[0].world->grows());
  REQUIRE(reports.began[1].world.has_value());
  CHECK(reports.began[1].world->grows());
  CHECK(reports.began[1].restartCount == 1);
  CHECK(reports.failure.empty());
}

TEST_CASE("recovery watch: generations begun back to back while it watches are each reported once, in order, "
          "and the newest one's outcome is reported",
          "[agent][recovery]") {
  MemoryStore store;
  Reports reports;
  RecoveryWatch watch(kPrefix, reports.handlers(store), 200ms);
  begin(store, 1, {{0, 1}, {0, 1}, 1, 1}, 0);
  REQUIRE(reports.beganWithin(1, 5s) == std::vector<uint64_t>{1});
  // Three more in one step of the store: the watch sees only the last value of the counter.
  auto writer = store.clone();
  drun::rdzv::StoreBatch batch;
  for (uint64_t g = 2; g <= 4; ++g) {
    batch.set(keys::world(kPrefix, g), keys::encodeWorld({{0, 1}, {0}}));
    batch.set(keys::restartCount(kPrefix, g), "0");
  }
  batch.set(keys::generation(kPrefix), "4");
  writer->runBatch(batch);
  CHECK(reports.beganWithin(4, 5s) == std::vector<uint64_t>{1, 2, 3, 4});
  store.set(keys::outcome(kPrefix, 4), std::string(keys::kFormed));
  CHECK(reports.decidedWithin(4, 5s));
  std::lock_guard lock(reports.mutex);
  CHECK(reports.failure.empty());
}

TEST_CASE("recovery watch: a watch that starts after generation g reports only those after it", "[agent][recovery]") {
  MemoryStore store;
  begin(store, 1, {{0, 1, 2}, {0, 1, 2}}, 1);
  begin(store, 2, {{0, 1}, {0, 1}}, 1);
  begin(store, 3, {{0, 1}, {0, 1}, 1, 1}, 1);
  Reports reports;
  RecoveryWatch watch(kPrefix, reports.handlers(store), 200ms, /*after=*/1);
  CHECK(reports.beganWithin(2, 5s) == std::vector<uint64_t>{2, 3});
}

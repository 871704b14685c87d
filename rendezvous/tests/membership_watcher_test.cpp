// MembershipWatcher on its own, over MemoryStore.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "drun/rendezvous/keys.hpp"
#include "drun/store/memory_store.hpp"
#include "membership_watcher.hpp"

using namespace drun::rdzv;
using namespace std::chrono_literals;

// The shape (from the interleavings over etcd): n0 waits in the exit barrier of round 0 while its
// partner re-forms with two newcomers, dies, and the newcomers' round 1 succeeds. Round 0's
// changes key never changes again, so the watcher must read the job's outcome also when a watch
// slice ends quietly, not only after a change, or n0 waits for ever.
TEST_CASE("membership watcher: a round that never changes again still reports the job's outcome", "[rendezvous]") {
  auto shared = MemoryStore::makeShared();
  MemoryStore writer(shared);
  WatchedRound round;
  round.runId = "quiet";
  round.round = 0;
  round.nodeCount = 2;
  round.endpoint = "memory";
  round.slice = 100ms;
  auto slot = std::make_shared<EventSlot>();
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<JobEvent> seen;
  slot->callback = [&](const JobEvent& e) {
    std::lock_guard lock(mutex);
    seen.push_back(e);
    changed.notify_all();
  };
  MembershipWatcher watcher(std::make_unique<MemoryStore>(shared), round, slot);
  std::this_thread::sleep_for(350ms);  // several quiet slices: nothing to report
  {
    std::lock_guard lock(mutex);
    REQUIRE(seen.empty());
  }
  writer.set(keys::outcome("quiet"), keys::encodeOutcome(std::nullopt));  // a later round succeeded
  std::unique_lock lock(mutex);
  const bool told = changed.wait_for(lock, 5s, [&] {
    for (const JobEvent& e : seen)
      if (e.kind == JobEvent::Kind::Succeeded) return true;
    return false;
  });
  CHECK(told);
}

#include "store_rejoin.hpp"

#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"
#include "reconnector.hpp"

namespace drun::rdzv {

void StoreRejoin::markLost() {
  std::lock_guard lock(mutex_);
  if (!lost_) lostAt_ = Clock::now();
  lost_ = true;
}

void StoreRejoin::noteFailed(uint64_t r) {
  std::lock_guard lock(mutex_);
  failedRound_ = r;
}

bool StoreRejoin::attempt(int attempt, const std::function<void()>& reconnect, const std::string& runId) {
  try {
    reconnect();
    return true;
  } catch (const NetworkError& e) {
    if (lost_ || attempt >= 3) throw;  // still lost (the store stayed gone): the answer
    spdlog::info("rendezvous '{}': {}; reconnecting", runId, e.what());
    markLost();
    return false;
  }
}

std::unique_ptr<LivenessStore> StoreRejoin::reconnect(
    const std::function<std::unique_ptr<LivenessStore>()>& connect, const C10dNode& node) {
  Clock::time_point lostAt;
  {
    std::lock_guard lock(mutex_);
    lostAt = lostAt_;
  }
  carried_.reset();
  auto store = rdzv::reconnect(connect, node, lostAt);
  lost_ = false;
  return store;
}

bool StoreRejoin::refill(LivenessStore& store, const std::string& runId, const RanRound& ran) {
  std::optional<uint64_t> failedRound;
  {
    std::lock_guard lock(mutex_);
    failedRound = failedRound_;
  }
  // A store that restarted empty: the survivors carry the job on (store_refill.hpp), this node
  // as a member of its last round, keeping its rank where it can.
  const Refill carried{ran.round + 1, ran.restartCount + (failedRound == ran.round ? 1 : 0)};
  if (!(refillRound_ = refillStore(store, runId, carried))) return false;
  carried_ = CarriedRound{ran.rosterDigest, ran.nodeRank, ran.nodeCount, ran.worldSize, ran.restartCount};
  spdlog::info("rendezvous '{}': re-forming the job in round {} of the restarted store (restart count {} or more)",
               runId, *refillRound_, carried.restarts);
  return true;
}

bool StoreRejoin::carriesOn(const Seat& seat) {
  std::optional<CarriedRound> before = std::exchange(carried_, std::nullopt);
  return before && !seat.memberId && before->carriesOn(seat.result, seat.rosterDigest);
}

}  // namespace drun::rdzv

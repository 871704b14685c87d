// StoreRejoin: this node's loss of the store and its way back. The membership watcher (its own
// thread) or a call that broke marks the store lost; the agent thread then connects again within
// reconnect_timeout of the loss (reconnector.hpp) and, when this node was a member of a round and
// the store restarted empty, refills it (store_refill.hpp): the round to re-form in, and whether
// the round it forms there carries the old one on unchanged (RoundResult::continuesPrevious).
//
// Threading: markLost() and noteFailed() from any thread; the rest on the agent thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "c10d_node.hpp"
#include "round_join.hpp"
#include "store_refill.hpp"

namespace drun::rdzv {

// The round this node ran last as a member: what a refill carries on.
struct RanRound {
  uint64_t round = 0;
  int restartCount = 0;
  int nodeRank = 0;
  int64_t nodeCount = 0;
  int worldSize = 0;
  uint64_t rosterDigest = 0;  // 0: not known (a place taken from a spare's wait)
};

class StoreRejoin {
 public:
  // The store is lost (a broken call, the watcher's report): the first loss's time is kept.
  void markLost();
  bool lost() const { return lost_; }
  // This node saw round `r` fail (it reported the failure, or was told).
  void noteFailed(uint64_t r);

  // One attempt (numbered from 0) at `reconnect`, the caller's way back (reconnect(), then
  // refill()): true when it came back. Rethrows a NetworkError while the store is still lost (it
  // stayed gone past reconnect_timeout) or at the fourth attempt; when a call after the
  // reconnect broke (the refill's), marks the store lost again and returns false: one more
  // attempt, as a join that broke.
  bool attempt(int attempt, const std::function<void()>& reconnect, const std::string& runId);
  // Connects again within reconnect_timeout of the loss (reconnector.hpp's errors); the store is
  // no longer lost once it answers.
  std::unique_ptr<LivenessStore> reconnect(const std::function<std::unique_ptr<LivenessStore>()>& connect,
                                           const C10dNode& node);
  // After reconnect(), for a node that ran `ran`: when the store lost the job, carries it on
  // (refillStore, the restart count raised by one when this node saw `ran` fail) and returns
  // true: takeRefillRound() is the round to join. False when the store still holds the job.
  bool refill(LivenessStore& store, const std::string& runId, const RanRound& ran);
  bool refilled() const { return refillRound_.has_value(); }
  std::optional<uint64_t> takeRefillRound() { return std::exchange(refillRound_, std::nullopt); }
  // Whether `seat` carries on the round this node ran when it refilled the store. Consumed: a
  // later seat is compared with nothing.
  bool carriesOn(const Seat& seat);

 private:
  std::mutex mutex_;  // lostAt_, failedRound_: set from the watcher's thread too
  Clock::time_point lostAt_;
  std::optional<uint64_t> failedRound_;  // the last round this node saw fail
  std::atomic<bool> lost_{false};
  std::optional<uint64_t> refillRound_;  // the round to re-form in a refilled store
  std::optional<CarriedRound> carried_;  // the round this node ran when it refilled the store
};

}  // namespace drun::rdzv

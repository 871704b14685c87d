// ExitBarrier: a node's presence in its job, from its first join to its way out.
//
// The job counts its known nodes — members, spares, late joiners — in `present` (+1 at a node's
// first join, in the batch that sets its first will; -1 when it leaves, or by that will when it
// dies). That one counter is the exit
// barrier: the node hosting the store serves until it is 0 (bounded by close_timeout), so a
// slow member or a paused spare still gets its answer, and then heartbeat_timeout past the last
// lease its server saw expire, so that a node its will counted out comes back to learn the
// outcome (bounded by close_timeout again); the node that makes it 0 removes the
// job's keys; and a new start with the same id that finds an ended job with nobody present
// resets it instead of tripping on its rounds.
//
// Threading: owned by the rendezvous, called from its one agent thread with its current store
// connection (replaced after a reconnect).
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "c10d_node.hpp"
#include "drun/store/store_batch.hpp"
#include "drun/store/store_server.hpp"

namespace drun::rdzv {

class ExitBarrier {
 public:
  explicit ExitBarrier(const C10dNode& node) : node_(node) {}

  // Before this node counts itself in: makes sure that the job it joins has not already ended
  // (an ended run's leftovers are cleared first, see exit_barrier.cpp). Nothing when counted.
  void enter(LivenessStore& store, const Deadline& deadline);
  // Whether enter() has anything to check (false once counted in). Its first look is one read
  // of the job's `outcome`: a caller may make it in a batch of its own (an absent outcome is the
  // whole check) and call enter() only when the outcome is there.
  bool mustEnter() const { return !present_; }
  // The count itself, +1 in `present`, goes into the batch that sets this node's will (RoundJoin),
  // right after the will, whose -1 balances it: a batch reaches the store whole or not at all, so
  // a node is never counted in without a will to count it out (as two round trips, a cut between
  // them would leave it counted in with no will, and it would count itself in again on return).
  // entered() takes the count's outcome once the batch ran. Returns the count's index; nullopt
  // (nothing added) when already counted.
  std::optional<size_t> countIn(StoreBatch& batch) const;
  void entered(const StoreBatch& batch, size_t countOp) { present_ = present_ || batch.ok(countOp); }
  // This node's connection closed: its will counted it out. It comes back as a node of the job:
  // an outcome found then is the job's end, not an earlier run's leftover.
  void forget() {
    present_ = false;
    cameBack_ = true;
  }

  // This node's workers all succeeded in `round` (of `nodeCount` members): the last member to
  // finish records the job's success. False (nothing else done): a member claimed the round for
  // a scale-up first, and this node must re-form with it.
  bool finish(LivenessStore& store, uint64_t round, int64_t nodeCount);
  // A member is about to stop its workers to take waiting nodes in: true when the round's
  // ending is (now) a scale-up, false when a member finished it first (keys::ending).
  bool claimScaleUp(LivenessStore& store, uint64_t round);
  // The job is over: records how (the first record stays) and wakes the nodes waiting for the
  // next round (spares), who learn it.
  void publishOutcome(LivenessStore& store, uint64_t round, const std::optional<FailureRecord>& failure);
  // Throws JobEnded when the job has an outcome (a node waiting to join learns it is over).
  void throwIfJobEnded(LivenessStore& store);

  // The will of this node while it holds no place in a round: present-1 if it is counted in
  // (keys::presenceWill), else none.
  Store::Will presenceWill() const { return present_ ? keys::presenceWill(node_.runId()) : Store::Will{}; }

  // Leaves for good: the will replaced first by presenceWill() (a clean leave is no loss),
  // `left` of the last round counted, then out of `present` with the will cleared (one batch); the last one out removes the job's keys, and a node
  // hosting the store (`hosted`, else null) waits for the others to leave first, then for the
  // nodes it lost without their leaving to come back (serveLostNodes).
  void leave(LivenessStore& store, std::optional<uint64_t> lastRound, int64_t nodeCount,
             const StoreServer* hosted);
  // For the store's host whose leave() failed (its own connection to its store broke: its lease
  // expired while this process was stopped, the store with it): what a clean leave gives the
  // others, over a new connection (`connect`) to its own server: the store up until they have
  // left, then while a node lost without leaving may come back. Any error ends it.
  void serveAfterOwnLoss(const std::function<std::unique_ptr<LivenessStore>()>& connect,
                         const StoreServer& hosted);

 private:
  // Adds the job's outcome (the first record stays) and a bump of the next round's status (its
  // waiters, spares, learn it) to `batch`; returns the bump's index.
  size_t addOutcome(StoreBatch& batch, uint64_t round, const std::optional<FailureRecord>& failure) const;
  static void runBumpingStatus(LivenessStore& store, StoreBatch& batch, std::optional<size_t> statusOp);
  void removeJobKeys(LivenessStore& store);
  void waitForOthersToLeave(LivenessStore& store);
  void serveLostNodes(const StoreServer& hosted) const;

  const C10dNode& node_;
  bool present_ = false;
  bool cameBack_ = false;  // lost the store and reconnected (forget())
};

}  // namespace drun::rdzv

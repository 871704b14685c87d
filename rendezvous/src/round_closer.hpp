// RoundCloser: reads and decides one round of a c10d job — whether the previous round re-forms,
// whether every survivor is back, which alive joiners are taken (members first, at most MAX),
// and the one decision among concurrent closers (compare_set on `state`), or a failed round
// that every waiter reports alike.
//
// The closer's snapshot of the alive joiners and the round's `left` counter agree: `left` is read
// before the joiners and their dead flags and again after; a will in between makes it look again
// (kMaxCloseLooks), so a joiner that died inside the window is never a member whose loss the
// watchers cannot see (its loss would already be inside leftAtClose).
//
// Threading: a short-lived view over the caller's store connection; no state of its own.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "c10d_node.hpp"
#include "drun/rendezvous/round_planner.hpp"

namespace drun::rdzv {

class RoundCloser {
 public:
  RoundCloser(LivenessStore& store, const C10dNode& node) : store_(store), node_(node) {}

  // The decision header of `round` when it closed successfully (its `status`), else nullopt.
  std::optional<keys::RoundState> closedRound(uint64_t round);
  // The previous round, when `round` re-forms a closed one.
  Reform readReform(uint64_t round);
  // Whether every member of the previous round that can come back is back in `round`. Until
  // then a re-forming round never closes: its survivors are still stopping their workers, and a
  // round formed without them would be a second job beside theirs.
  bool everySurvivorBack(uint64_t round, const Reform& reform);
  // Closes the round when at least `needed` alive nodes joined (and, re-forming, every survivor
  // is back). Returns false when it cannot close yet (nothing written).
  bool tryClose(uint64_t round, int needed, const Reform& reform);
  // The alive joiners the last tryClose that read them counted (a joiner whose will ran, or that
  // gave up, is an arrival but no longer one of them).
  int aliveJoiners() const { return aliveJoiners_; }
  // Decides `round` as failed, so that every node waiting in it gets the same error, and throws
  // it (the decision already there, if another node decided first).
  [[noreturn]] void failRound(uint64_t round, const std::string& message);
  // "node(s) A, B" of the previous round whose dead flag is set (error path: O(N) reads).
  std::string lostNodes(const Reform& reform);
  void removeDead(uint64_t round, std::vector<keys::NodeDescriptor>& nodes);

 private:
  void publish(const RoundDecision& d);
  int restartCountFor(uint64_t round);
  void forgetRound(uint64_t round);

  LivenessStore& store_;
  const C10dNode& node_;
  int aliveJoiners_ = 0;
};

}  // namespace drun::rdzv

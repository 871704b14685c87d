// JobLedger: the job's counters of one closed round, read from the store at one point, and the
// one place where "members gone", "members lost", "survivors" and "every member finished" are
// computed from them. The membership watcher, the re-forming join and the exit path all ask it;
// none of them does this arithmetic itself.
//
// A round's counters count from 0 while the round is open (wills of joiners that died before the
// close); its decision records `left` as the closer read it (leftAtClose), so every count of
// members is "counter - leftAtClose". `left` counts clean leaves and wills, `lost` wills only.
//
// Threading: plain values and a function of one Store; the caller serialises its store calls.
#pragma once

#include <cstdint>
#include <string>

#include "drun/rendezvous/keys.hpp"
#include "drun/store/store.hpp"

namespace drun::rdzv {

// What the closer of a round decided that the ledger counts from.
struct RoundBaseline {
  std::string runId;
  uint64_t round = 0;
  int nodeCount = 0;
  int64_t leftAtClose = 0;
};

struct JobLedger {
  RoundBaseline base;
  int64_t left = 0;       // members gone: clean leaves and wills (plus leftAtClose)
  int64_t lost = 0;       // wills only (plus leftAtClose)
  int64_t finished = 0;   // members whose workers all succeeded
  int64_t waiting = 0;    // nodes that announced they wait to join the next round
  int64_t replaced = 0;   // members gone whose place a spare took (docs/recovery.md "A lost node")
  int64_t dropped = 0;    // members gone that the round shrank without (docs/recovery.md "Elastic in place")
  int64_t grown = 0;      // members the round grew by in place (a grow's taker: "Elastic in place")
  bool failed = false;    // the round has a failure record
  keys::RoundEnding ending = keys::RoundEnding::Open;  // finish or scale-up, whichever came first

  // A member whose place a spare took is not gone: the spare is that member now.
  int64_t membersGone() const {
    const int64_t gone = clampedSince(left) - replaced;
    return gone > 0 ? gone : 0;
  }
  // Every loss, replaced or not: each is news once (the watchers count them).
  int64_t membersLost() const { return clampedSince(lost); }
  // Members of the round that can still come back to re-form it.
  int64_t survivors() const {
    const int64_t alive = members() - membersGone();
    return alive > 0 ? alive : 0;
  }
  // A round claimed for a scale-up never succeeds: its members re-form, and `finished` counts
  // the ones that finished after the claim too (ExitBarrier::finish).
  bool everyMemberFinished() const {
    return ending == keys::RoundEnding::Finish && finished + dropped >= members();
  }
  // The round's members: its decision's, and the ones it grew by.
  int64_t members() const { return int64_t{base.nodeCount} + grown; }

 private:
  int64_t clampedSince(int64_t counter) const {
    return counter > base.leftAtClose ? counter - base.leftAtClose : 0;
  }
};

// Reads the round's counters and ending (tryGets in one batch: no call blocks). Throws
// ProtocolError for a counter that is not a number or an ending that is neither (written by
// something other than an agent).
JobLedger readLedger(LivenessStore& store, const RoundBaseline& base);

// The members of `base`'s round that can still come back (one batch of two tryGets): what a
// re-forming join asks at every event.
int64_t survivorsOf(LivenessStore& store, const RoundBaseline& base);

}  // namespace drun::rdzv

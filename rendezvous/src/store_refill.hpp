// Refilling a fresh store from what the survivors know. When the store restarts empty (a
// drun-rendezvous daemon restarted, the embedded store's host restarted its agent), the
// survivors reconnect and find their job gone. Rather than forming it anew (restart count 0, a
// fresh restart budget), they carry it on:
//
//   - the first survivor back writes rdzv/<id>/refill = "<R>\t<C>" (compare_set from absent),
//     R = its last round + 1, and round = R; the others read R from it (one round for all:
//     never two groups with rank 0);
//   - every survivor raises C to the restart count it carries (its round's, or its agent's with
//     the round's in-process recoveries when more, + 1 when that round failed), by compare_set:
//     the most any survivor knows, so a failure is never forgotten;
//   - round R then forms like a first round (MAX arrivals or the last call), members first,
//     keeping their node ranks; its closer takes C as the restart count (RoundCloser).
//
// A newcomer that joined round 0 of the fresh store before the survivors came back is moved
// to R (status of round 0 is bumped; RoundJoin looks at the refill record).
// A store that still holds the job (a cut link) is no fresh store: nothing is written.
//
// Round R carries the survivors' last round on unchanged when its roster is that round's (the
// survivors keep their node ids through a refill: the same roster digest) with the same world
// and restart count: then no worker need stop (RoundResult::continuesPrevious). Any other
// outcome (a member that did not come back, a newcomer, a failure carried in the count) is a
// membership change, and the job re-forms as after any store loss.
//
// Threading: functions over the caller's store connection, on the agent thread.
#pragma once

#include <optional>
#include <string>

#include "drun/rendezvous/rendezvous.hpp"
#include "drun/store/store.hpp"

namespace drun::rdzv {

struct Refill {
  uint64_t round = 0;  // the round the survivors re-form
  int restarts = 0;    // the job's restart count carried into it
};

// The round a survivor ran when it refilled the store: what the refilled round is compared with.
struct CarriedRound {
  uint64_t rosterDigest = 0;  // keys::rosterDigest of its members; 0: unknown, never carried on
  int nodeRank = 0;
  int64_t nodeCount = 0;
  int worldSize = 0;
  int restartCount = 0;

  bool carriesOn(const RoundResult& refilled, uint64_t refilledDigest) const {
    return rosterDigest != 0 && refilledDigest == rosterDigest && refilled.nodeRank == nodeRank &&
           refilled.nodeCount == nodeCount && refilled.worldSize == worldSize &&
           refilled.restartCount == restartCount;
  }
};

std::string encodeRefill(const Refill& refill);
std::optional<Refill> parseRefill(const std::optional<Bytes>& value);  // nullopt: absent or malformed

// The refill record of job `runId`, if its store was refilled.
std::optional<Refill> readRefill(Store& store, const std::string& runId);

// After reconnecting: when the store lost the job (no round, no outcome), refills it with
// `carried` (or joins the refill another survivor made) and returns the round to join; nullopt
// when the store still holds the job.
std::optional<uint64_t> refillStore(Store& store, const std::string& runId, const Refill& carried);

}  // namespace drun::rdzv

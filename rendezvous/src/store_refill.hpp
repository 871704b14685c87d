// Refilling a fresh store from what the survivors know. When the store restarts empty (a
// drun-rendezvous daemon restarted, the embedded store's host restarted its agent), the
// survivors reconnect and find their job gone. Rather than forming it anew (restart count 0, a
// fresh restart budget), they carry it on:
//
//   - the first survivor back writes rdzv/<id>/refill = "<R>\t<C>" (compare_set from absent),
//     R = its last round + 1, and round = R; the others read R from it (one round for all:
//     never two groups with rank 0);
//   - every survivor raises C to the restart count it carries (its round's, + 1 when that round
//     failed), by compare_set: the most any survivor knows, so a failure is never forgotten;
//   - round R then forms like a first round (MAX arrivals or the last call), members first,
//     keeping their node ranks; its closer takes C as the restart count (RoundCloser).
//
// A newcomer that joined round 0 of the fresh store before the survivors came back is moved
// to R (status of round 0 is bumped; RoundJoin looks at the refill record).
// A store that still holds the job (a cut link) is no fresh store: nothing is written.
//
// Threading: functions over the caller's store connection, on the agent thread.
#pragma once

#include <optional>
#include <string>

#include "drun/store/store.hpp"

namespace drun::rdzv {

struct Refill {
  uint64_t round = 0;  // the round the survivors re-form
  int restarts = 0;    // the job's restart count carried into it
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

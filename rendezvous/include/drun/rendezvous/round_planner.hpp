// The round planner: what the closer of a c10d round decides, as pure functions of the joiners'
// descriptors (no store, no network). The algorithm around it: c10d_rendezvous.hpp.
//
// Threading: pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "drun/rendezvous/keys.hpp"

namespace drun::rdzv {

// The outcome of a round, computed by its closer from the members' descriptors (arrival order).
struct RoundPlan {
  std::vector<int> nodeRank;      // per member (members' order)
  std::vector<int> rankOffset;    // per member: prefix sum of the local world sizes
  std::vector<int> memberAtRank;  // node rank -> member index
  int worldSize = 0;
  std::string masterAddr;  // node rank 0's address
  uint16_t masterPort = 0; // node rank 0's reserved port
};
// Node ranks: requested ranks (--node-rank) are honoured, then members of the previous round get
// their old rank back when it is free and in range, the other nodes fill the free ranks in
// (host, arrival) order; rank offsets are prefix sums of the local world sizes. Throws
// InvalidArgument naming the nodes for a rank claimed twice or one out of range.
RoundPlan planRound(const std::vector<keys::NodeDescriptor>& members);

// The closer's decision for `members` (the alive joiners taken into the round: at most MAX, in
// arrival order): planRound's result, or an error (a node rank claimed twice) that every joiner
// reports. The closer writes compare_set(state, "" -> decision); if it won, multi_set(keys,
// values): each member's assignment, the hosts list, round = r + 1 and, last, status = the
// decision's header.
struct RoundDecision {
  keys::RoundState state;
  std::string decision;  // encodeState(state): the value of `state`
  std::vector<std::string> keys;
  std::vector<Bytes> values;
};
// The round's counters as the closer read them: `changes` before its snapshot of the joiners
// (the membership watch starts there), `left` after it (wills of joiners not taken count there).
struct RoundCounters {
  int64_t changes = 0;
  int64_t left = 0;
  int restartCount = 0;  // the job's restarts as of this round
};
// Keys per multiSet when the closer publishes a decision (in order, `status` last): under
// StoreLimits::maxKeysPerRequest (65536) and, at about 100 bytes a key and value, under a MiB a
// request. A round of 100,000 nodes publishes in 13 requests.
inline constexpr size_t kKeysPerPublish = 8192;
RoundDecision decideRound(const std::string& runId, uint64_t round,
                          const std::vector<keys::NodeDescriptor>& members, RoundCounters counters);

// The joiners a closer takes, from the alive ones in arrival order: members of the previous round
// first (a spare or a newcomer never displaces a member), then the others, at most maxNodes.
std::vector<keys::NodeDescriptor> pickMembers(std::vector<keys::NodeDescriptor> alive,
                                              int maxNodes);

}  // namespace drun::rdzv

// VacancyBoard: a lost member's place in a running round, offered to a spare under --recovery
// in-process (docs/recovery.md "A lost node"; key names in keys.hpp). Survivors claim the
// places of lost members (one claimer per loss), post them with the recovery generation their
// workers re-form in, and withdraw them at the deadline; a spare waiting in the next round takes
// one (exactly one spare per place: compare_set on its taker) and becomes a member of the
// running round under a new node id, with the lost member's node rank and ranks.
//
// A place is keyed by the lost member's id: a spare that took one and is lost in turn leaves a
// place of its own (the round's current members are the roster with each taken place's taker in
// its node rank).
//
// Threading: free functions of one store connection (the caller's); each call blocks on the
// store with its deadlines. Values read are untrusted: malformed offers are skipped (ProtocolError
// only where nothing else can be done).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "c10d_node.hpp"
#include "drun/rendezvous/rendezvous.hpp"
#include "drun/store/store.hpp"

namespace drun::rdzv {

// The value of vacancy/<lost id>:
//   "<generation>\t<restart count>\t<node rank>\t<rank offset>\t<local world size>\t<lost at claim>\t
//    <lost node's name>"
struct VacancyOffer {
  uint64_t generation = 0;
  int restartCount = 0;
  int nodeRank = 0;
  int rankOffset = 0;
  int localWorldSize = 1;
  int64_t lostAtClaim = 0;  // Vacancy::lostAtClaim
  std::string node;
};
std::string encodeOffer(const VacancyOffer& offer);
VacancyOffer parseOffer(std::string_view value);  // throws ProtocolError

// The survivors' side (the caller is a member of `round`, `me` its node id).
std::vector<Vacancy> claimLostMembers(LivenessStore& store, const std::string& runId, uint64_t round,
                                      const std::string& me);
void postVacancy(LivenessStore& store, const std::string& runId, const Vacancy& vacancy, uint64_t generation,
                 int restartCount);
bool withdrawVacancy(LivenessStore& store, const std::string& runId, const Vacancy& vacancy);

// A grow (docs/recovery.md "Elastic in place"): the survivors' side. With a node waiting in
// round + 1 (registered, not dead) and the job's `nodeCount` below `maxNodes`, claims the next
// grow of the round (compare_set on vacancy/grow-<k>/claim, k = `grows`: exactly one survivor,
// one grow at a time) and returns its place: node rank `nodeCount`, rank offset `worldSize`, the
// waiting node's local world size. nullopt: nobody waits, the job is full, or another survivor's
// grow is open. The place is then posted and withdrawn as a lost member's (postVacancy,
// withdrawVacancy); its claimer ends the grow once it is decided (endGrowth), which lets the
// next one be claimed.
std::optional<Vacancy> claimGrowth(LivenessStore& store, const std::string& runId, uint64_t round,
                                   const std::string& me, int nodeCount, int worldSize, int maxNodes);
void endGrowth(LivenessStore& store, const std::string& runId, const Vacancy& place);

// The spare's side: the place this node took in round `running`, as a member under `memberId`.
struct TakenPlace {
  RoundResult result;
  std::string memberId;       // this node's id as the member
  // The membership watcher starts here: the round's changes at the take, or 0 (look at once)
  // when a member was lost after the place was claimed.
  int64_t changesAtTake = 0;
  int64_t leftAtClose = 0;
  int64_t lostSeen = 0;       // members lost when the place was claimed (its own loss among them):
                              // not news to it; a later loss is

  int decidedNodeCount = 0;   // the running round's decision's node count (the ledger's base)
};
// Looks at the offers of round `running` and takes the first open one of this node's local world
// size (a grow's place too: the round's node count and world size then include it): a member of `running` under `memberId` from then on. Its registration in the round it
// waits in (running + 1, under its current id) is given up in the same batch.
std::optional<TakenPlace> takeVacancy(LivenessStore& store, const C10dNode& node, uint64_t running,
                                      const std::string& memberId);

}  // namespace drun::rdzv

// The in-process recovery's keys in the workers' store (docs/recovery.md), under the round's
// prefix P (DRUN_WORKER_STORE_PREFIX, keys::workerStore() on a c10d store), and the format of
// their values:
//
//   P recovery/generation             decimal: the current generation (absent = 0), moved by
//                                     compare_set(g-1 -> g) by the agent that opens g
//   P recovery/<g>/opener             compare_set(absent -> "<host> pid <pid> rank <rank>"): the
//                                     agent that claimed g (two agents reading the same current
//                                     generation cannot both open the next one)
//   P recovery/<g>/lost/<rank>        why rank was lost: JSON {"rank","local_rank","node",
//                                     "exit_code","signal","pid","time_ms"} (the agent's codec)
//   P recovery/<g>/lost_ranks         the ranks lost in g, decimal, comma-separated: who to read
//                                     lost/<rank> of without trying every rank
//   P recovery/<g>/restart_count      the job's restart count including g's recovery
//   P recovery/<g>/joined/<rank>      "<host> pid <pid>": the rank took part in g
//   P recovery/<g>/formed             counter: the ranks whose g communicator connected
//   P recovery/<g>/outcome            compare_set(absent -> it), the first writer wins: "formed",
//                                     or "fallback: <reason>" (the opener, at recovery_timeout)
//   P recovery/<g>/world              a shrink or a grow (written before g begins): the world of g
//                                     as "<ranks>\t<node ranks>", each a comma-separated list of
//                                     the generation before's ranks (node ranks) kept, in their new
//                                     order: the rank at index i is rank i of g; a grow adds
//                                     "\t<ranks added>\t<nodes added>": new ranks (node ranks)
//                                     numbered after the kept ones. The size is kept + added
//                                     (absent: the world is unchanged)
//
// Every value read is untrusted: the parsers throw ProtocolError naming the key's content.
// Threading: pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace drun::rdzv::recovery {

std::string generation(std::string_view prefix);
std::string opener(std::string_view prefix, uint64_t generation);
std::string lost(std::string_view prefix, uint64_t generation, int rank);
std::string lostRanks(std::string_view prefix, uint64_t generation);
std::string restartCount(std::string_view prefix, uint64_t generation);
std::string joined(std::string_view prefix, uint64_t generation, int rank);
std::string formed(std::string_view prefix, uint64_t generation);
std::string outcome(std::string_view prefix, uint64_t generation);
std::string world(std::string_view prefix, uint64_t generation);

// `generation`'s value: absent = 0. Throws ProtocolError when it is not a decimal count.
uint64_t parseGeneration(const std::optional<std::string>& value);

// `lost_ranks`: "3" or "3,5".
std::string encodeRanks(const std::vector<int>& ranks);
std::vector<int> parseRanks(std::string_view value);  // throws ProtocolError

// `world`: the ranks and node ranks of the generation before that a shrink or a grow keeps, in
// their new order (rank i of the new world is ranks[i]), then the ranks and nodes a grow adds
// (numbered from ranks.size() and nodeRanks.size()).
struct World {
  std::vector<int> ranks;
  std::vector<int> nodeRanks;
  int addedRanks = 0;
  int addedNodes = 0;
  // The new rank of `previous`, or -1 when the shrink dropped it.
  int renumber(int previous) const;
  int renumberNode(int previous) const;
  int size() const { return static_cast<int>(ranks.size()) + addedRanks; }
  int nodeCount() const { return static_cast<int>(nodeRanks.size()) + addedNodes; }
  bool grows() const { return addedRanks > 0; }
};
std::string encodeWorld(const World& world);
// A node's place numbered in one generation, renumbered through the worlds of the generations
// after it, in their order: nullopt when one of them dropped it. A node's ranks are contiguous
// and a world keeps their order, so its first rank carries the others.
struct Place {
  int nodeRank = 0;
  int rankOffset = 0;
};
std::optional<Place> renumberPlace(Place place, const std::vector<World>& worldsAfter);
// Throws ProtocolError for anything but two non-empty lists of distinct ranks, optionally
// followed by two positive counts (a grow's).
World parseWorld(std::string_view value);

// `outcome`.
inline constexpr std::string_view kFormed = "formed";
inline constexpr std::string_view kFallbackPrefix = "fallback: ";
std::string encodeFallback(std::string_view reason);
struct Outcome {
  bool formed = false;
  std::string reason;  // a fallback's reason
};
Outcome parseOutcome(std::string_view value);  // throws ProtocolError for anything else

}  // namespace drun::rdzv::recovery

// The agent's store calls of an in-process recovery (docs/recovery.md; key names:
// drun/rendezvous/recovery_keys.hpp): opening a generation, reading one that began, and the
// fallback's reason and decision at recovery_timeout. Every call blocks on the workers' store
// with that store's deadlines: run them off the loop.
//
// Threading: free functions; the store's rules. Values read are untrusted: ProtocolError.
#pragma once

#include <chrono>
#include <map>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "drun/rendezvous/recovery_keys.hpp"
#include "drun/store/store.hpp"

namespace drun::agent::detail {

// A rank lost to a generation: the value of recovery/<g>/lost/<rank>.
struct LostWorker {
  int rank = 0;
  int localRank = 0;
  std::string node;
  int exitCode = 0;
  int signal = 0;
  int64_t pid = 0;
  int64_t timeMs = 0;  // wall clock of the death, ms since the epoch
};
std::string encodeLost(const LostWorker& lost);  // JSON
LostWorker parseLost(const std::string& value);  // throws ProtocolError

// What every agent reads of a generation that began.
struct Generation {
  uint64_t number = 0;
  std::vector<LostWorker> lost;
  int restartCount = 0;
  std::optional<rdzv::recovery::World> world;  // a shrink: the world of this generation
  std::string opener;                          // recovery/<g>/opener: "<host> pid <pid> ..."
};

// Whether the agent on `host` running in this process opened the generation (its opener).
bool openedHere(const Generation& generation, const std::string& host);

// Opens a generation for `lost`: claims the first one after the current generation that nobody
// claimed (opener), writes its lost/<rank>, lost_ranks and restart_count, then moves
// `generation` from g-1 to g (waiting, up to `timeout`, for an earlier claimer to move it to g-1
// first). Returns the generation opened.
uint64_t openGeneration(rdzv::LivenessStore& store, const std::string& prefix, const LostWorker& lost,
                        int restartCount, std::chrono::milliseconds timeout);
// The same for several ranks lost at once (a lost node's): `opener` names the claiming agent.
// With `world`, the generation is a shrink or a grow (which may lose no rank): its world record
// is written with the rest.
uint64_t openGeneration(rdzv::LivenessStore& store, const std::string& prefix, const std::vector<LostWorker>& lost,
                        const std::string& opener, int restartCount, std::chrono::milliseconds timeout,
                        const std::optional<rdzv::recovery::World>& world = std::nullopt);

// Reads generation g's lost ranks, restart count and world (written before g began).
Generation readGeneration(rdzv::LivenessStore& store, const std::string& prefix, uint64_t g);

// The world records of the generations after `after` up to the current one, by generation (a
// generation without one kept the world as it was).
std::map<uint64_t, rdzv::recovery::World> readWorldsAfter(rdzv::LivenessStore& store, const std::string& prefix,
                                                          uint64_t after);

// The ranks of generation g, in g's numbering, that no survivor holds: each generation's lost
// ranks replaced in place and a grow's added ranks, carried through the worlds of the generations
// after theirs up to g (a shrink drops the ranks it lost and renumbers the others). Generations
// not in `generations` changed nothing.
std::vector<int> newcomerRanks(const std::map<uint64_t, Generation>& generations, uint64_t g);

// Why generation g has not formed, from who joined it (joined[r]: rank r of g did): "the
// survivors never joined the recovery" when no rank but the newcomers did, else "rank 3 never
// joined" / "ranks 1, 2 never joined", every rank in g's numbering.
std::string fallbackWording(uint64_t g, const std::vector<bool>& joined, const std::vector<int>& newcomers);

// fallbackWording of generation g of `worldSize` ranks, with who joined read from the store.
std::string fallbackReason(rdzv::LivenessStore& store, const std::string& prefix, uint64_t g, int worldSize,
                           const std::vector<int>& newcomers);

// compare_set(outcome, absent -> "fallback: <reason>"): returns the outcome now stored (another
// writer's "formed" may have come first).
std::string decideFallback(rdzv::LivenessStore& store, const std::string& prefix, uint64_t g,
                           const std::string& reason);

// After the store restarted empty under running workers (a refilled rendezvous store whose round
// carries the workers' on): writes again what the workers and the agents read of the
// generations that began under `prefix` (restart_count, lost_ranks, lost/<rank>, world), the
// outcome "formed" of `current` (the one the workers run in), then moves `generation` from
// absent to `current`. Idempotent: every agent of the job writes the same; a generation opened
// since by another agent that refilled first is left alone.
void refillGenerations(rdzv::LivenessStore& store, const std::string& prefix,
                       const std::map<uint64_t, Generation>& generations, uint64_t current);

}  // namespace drun::agent::detail

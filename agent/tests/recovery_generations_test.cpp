// The fallback's reason at recovery_timeout (recovery_generations.hpp): which ranks of a
// generation no survivor holds, and the wording from who joined, every rank named in the
// generation's own numbering.
#include <unistd.h>

#include <catch2/catch.hpp>

#include "recovery_generations.hpp"

using namespace drun::agent::detail;
using drun::rdzv::recovery::World;

namespace {

// Generation g lost `ranks` (numbered in the generation before g).
Generation losing(uint64_t g, const std::vector<int>& ranks) {
  Generation began;
  began.number = g;
  for (int rank : ranks) began.lost.push_back(LostWorker{rank, rank % 2, "host", 0, 9, 0, 0});
  return began;
}

std::vector<bool> joinedOnly(int worldSize, const std::vector<int>& ranks) {
  std::vector<bool> joined(size_t(worldSize), false);
  for (int rank : ranks) joined[size_t(rank)] = true;
  return joined;
}

}  // namespace

TEST_CASE("fallback reason: a worker death's generation waits for its replacement and the survivors",
          "[recovery]") {
  const std::map<uint64_t, Generation> generations{{1, losing(1, {3})}};
  const std::vector<int> newcomers = newcomerRanks(generations, 1);
  CHECK(newcomers == std::vector<int>{3});
  CHECK(fallbackWording(1, joinedOnly(4, {3}), newcomers) == "the survivors never joined the recovery");
  CHECK(fallbackWording(1, joinedOnly(4, {0, 1, 2}), newcomers) == "rank 3 never joined");
  CHECK(fallbackWording(1, joinedOnly(4, {0, 3}), newcomers) == "ranks 1, 2 never joined");
  CHECK(fallbackWording(1, joinedOnly(4, {0, 1, 2, 3}), newcomers) == "generation 1 did not form in time");
}

// Host 1 of 3 (ranks 2, 3) lost, no spare took its place: generation 2 shrinks to host 0 (ranks
// 0, 1) and host 2 (ranks 4, 5 before, 2, 3 now). Only host 2's workers joined.
TEST_CASE("fallback reason: after a shrink the ranks missing are named in the shrunk world's numbering",
          "[recovery]") {
  Generation shrink = losing(2, {2, 3});
  shrink.world = World{{0, 1, 4, 5}, {0, 2}};
  const std::map<uint64_t, Generation> generations{{1, losing(1, {2, 3})}, {2, shrink}};
  const std::vector<int> newcomers = newcomerRanks(generations, 2);
  CHECK(newcomers.empty());  // the shrink replaced nobody
  CHECK(fallbackWording(2, joinedOnly(4, {2, 3}), newcomers) == "ranks 0, 1 never joined");
  CHECK(fallbackWording(2, joinedOnly(4, {0, 1}), newcomers) == "ranks 2, 3 never joined");
  // The lost node's own generation still waits for a spare in its place.
  CHECK(newcomerRanks(generations, 1) == std::vector<int>{2, 3});
}

TEST_CASE("fallback reason: a rank replaced before a shrink keeps its new number, one the shrink dropped goes",
          "[recovery]") {
  Generation shrink = losing(2, {0, 1});
  shrink.world = World{{2, 3, 4, 5}, {1, 2}};
  const std::map<uint64_t, Generation> generations{{1, losing(1, {5})}, {2, shrink}, {3, losing(3, {0})}};
  CHECK(newcomerRanks(generations, 2) == std::vector<int>{3});
  CHECK(newcomerRanks(generations, 3) == std::vector<int>{0, 3});
  CHECK(fallbackWording(3, joinedOnly(4, {0, 3}), newcomerRanks(generations, 3)) ==
        "the survivors never joined the recovery");
}

TEST_CASE("fallback reason: a grow's added ranks are newcomers", "[recovery]") {
  Generation grow;
  grow.number = 1;
  grow.world = World{{0, 1}, {0}, 2, 1};
  const std::map<uint64_t, Generation> generations{{1, grow}};
  const std::vector<int> newcomers = newcomerRanks(generations, 1);
  CHECK(newcomers == std::vector<int>{2, 3});
  CHECK(fallbackWording(1, joinedOnly(4, {2, 3}), newcomers) == "the survivors never joined the recovery");
  CHECK(fallbackWording(1, joinedOnly(4, {0, 1, 2}), newcomers) == "rank 3 never joined");
}

TEST_CASE("fallback reason: more than eight ranks missing are counted, not all named", "[recovery]") {
  CHECK(fallbackWording(1, joinedOnly(12, {0}), {}) == "ranks 1, 2, 3, 4, 5, 6, 7, 8, ... (11 in all) never joined");
}

TEST_CASE("recovery generations: the generation this agent opened is told apart by its opener", "[recovery]") {
  Generation began;
  const std::string pid = std::to_string(::getpid());
  began.opener = "node-a pid " + pid + " (a lost node)";
  CHECK(openedHere(began, "node-a"));
  CHECK_FALSE(openedHere(began, "node"));  // another host whose name begins the same
  CHECK_FALSE(openedHere(began, "node-b"));
  began.opener = "node-a pid " + pid + "1 (a lost node)";  // another agent on the same host
  CHECK_FALSE(openedHere(began, "node-a"));
  began.opener = "";
  CHECK_FALSE(openedHere(began, "node-a"));
}

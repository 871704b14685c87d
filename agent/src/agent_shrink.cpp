// The elastic agent's shrink in place (docs/recovery.md "Elastic in place"): under --recovery
// in-process with --nnodes MIN:MAX, a lost node's place that no spare took within its deadline
// (agent_node_recovery.cpp withdraws it) is dropped instead of restarting the job, when at least
// MIN nodes remain. The claimer counts the dropped members in the round (the exit barrier counts
// them as finished) and opens a generation of kind shrink: its world record keeps the other
// ranks and node ranks, renumbered densely in their order. No unit of --max-restarts is spent (a
// membership change spends none). Every agent, learning of the generation, takes its new rank
// offset, node rank, world size and node count for what it starts later, says so, and waits for
// the generation's outcome as for any other; the claimer decides its fallback at
// recovery_timeout (a program that does not use the API never joins it).
#include <signal.h>
#include <unistd.h>

#include <algorithm>

#include <spdlog/spdlog.h>

#include "drun/rendezvous/keys.hpp"
#include "elastic_agent_impl.hpp"

namespace drun::agent {

using detail::Event;
using detail::Generation;
using detail::LostWorker;

namespace {

int64_t epochMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool dropsRank(const std::vector<rdzv::Vacancy>& places, int rank) {
  return std::any_of(places.begin(), places.end(), [rank](const rdzv::Vacancy& v) {
    return rank >= v.rankOffset && rank < v.rankOffset + v.localWorldSize;
  });
}

// The places that were members of the round (a grow's place nobody took never was one).
int membersOf(const std::vector<rdzv::Vacancy>& places) {
  return static_cast<int>(std::count_if(places.begin(), places.end(),
                                        [](const rdzv::Vacancy& v) { return !rdzv::keys::isGrowPlace(v.lostId); }));
}

bool dropsNode(const std::vector<rdzv::Vacancy>& places, int nodeRank) {
  return std::any_of(places.begin(), places.end(), [nodeRank](const rdzv::Vacancy& v) { return v.nodeRank == nodeRank; });
}

// "node hostB (ranks 2, 3)" for each node whose ranks a generation lost.
std::string lostNodes(const Generation& g) {
  std::vector<std::pair<std::string, std::string>> nodes;
  for (const LostWorker& l : g.lost) {
    auto at = std::find_if(nodes.begin(), nodes.end(), [&](const auto& n) { return n.first == l.node; });
    if (at == nodes.end()) nodes.emplace_back(l.node, std::to_string(l.rank));
    else at->second += ", " + std::to_string(l.rank);
  }
  std::string out;
  for (const auto& [node, ranks] : nodes)
    out += (out.empty() ? "node " : ", node ") + node + " (rank" + (ranks.find(',') == std::string::npos ? " " : "s ") +
           ranks + ")";
  return out;
}

}  // namespace

bool ElasticAgent::Impl::canShrinkWithout(const std::vector<rdzv::Vacancy>& places) const {
  const int left = round.nodeCount - static_cast<int>(places.size());
  return !places.empty() && left >= 1 && left >= config.rendezvous.minNodes;
}

// The claimer, at the lost places' deadline with none taken: the round goes on without them.
void ElasticAgent::Impl::shrinkInPlace(const Input& in, const std::vector<rdzv::Vacancy>& places) {
  const uint64_t r = round.round;
  const std::string prefix = workerStore->prefix(r);
  rdzv::recovery::World world;
  for (int rank = 0; rank < round.worldSize; ++rank)
    if (!dropsRank(places, rank)) world.ranks.push_back(rank);
  for (int node = 0; node < round.nodeCount; ++node)
    if (!dropsNode(places, node)) world.nodeRanks.push_back(node);
  std::vector<LostWorker> lost;
  // A grow's place nobody took lost no process: recorded without a signal (applyShrink says so).
  for (const rdzv::Vacancy& v : places)
    for (int local = 0; local < v.localWorldSize; ++local)
      lost.push_back({v.rankOffset + local, local, v.node, 0, rdzv::keys::isGrowPlace(v.lostId) ? 0 : SIGKILL, 0,
                      epochMs()});
  const std::string me = config.hostname + " pid " + std::to_string(::getpid()) + " (a shrink)";
  const int count = jobRestarts;
  // Not counted in opensInFlight: the generation opened here is the one whose outcome counts (its
  // "formed" may arrive before this returns, and must not wait for it).
  offLoopCall(
      [this, prefix, world, lost, me, count, dropped = membersOf(places)] {
        if (dropped > 0) rendezvous->dropMembers(dropped);
        try {
          return detail::openGeneration(recoveryStore(), prefix, lost, me, count, config.recovery.timeout, world);
        } catch (...) {
          recoveryConnection.reset();
          throw;
        }
      },
      [this, r](uint64_t g) {
        const bool waiting = state == AgentState::Recovering || state == AgentState::Finishing;
        if (r != round.round || !waiting || generation > g) return;  // formed already, or gone
        opened = Opened{g, round.rankOffset, 0};
        armRecoveryDue(g, config.recovery.timeout);
      },
      [this, r, in](std::exception_ptr error) {
        if (r != round.round) return;
        Input failed = in;
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          failed.reason = std::string("no spare took the lost node's place, and the job could not shrink in place: ") +
                          e.what();
        }
        fallBack(failed);
      });
}

// Every node: a shrink began. Its new place in the smaller world is what later replacements
// and the environment use; a node the shrink dropped (cut off, then back) re-forms.
void ElasticAgent::Impl::applyShrink(const Input& in) {
  const Generation& began = generations[in.generation];
  const rdzv::recovery::World& world = *began.world;
  const int offset = world.renumber(round.rankOffset), nodeRank = world.renumberNode(round.nodeRank);
  if (offset < 0 || nodeRank < 0) {
    Input dropped;
    dropped.reason = "generation " + std::to_string(in.generation) + " shrank the job without this node";
    onLoop([this, dropped] { dispatch(Event::LossUnrecovered, dropped); });
    return;
  }
  const int worldBefore = round.worldSize, nodesBefore = round.nodeCount;
  if (round.hosts.size() == size_t(nodesBefore)) {
    std::vector<std::string> hosts;
    for (int n : world.nodeRanks)
      if (n >= 0 && size_t(n) < round.hosts.size()) hosts.push_back(round.hosts[size_t(n)]);
    round.hosts = std::move(hosts);
  }
  round.rankOffset = offset;
  round.nodeRank = nodeRank;
  round.worldSize = static_cast<int>(world.ranks.size());
  round.nodeCount = static_cast<int>(world.nodeRanks.size());
  note("recovery_shrunk", {{"round", round.round}, {"generation", in.generation}, {"world_size_before", worldBefore},
                           {"world_size", round.worldSize}, {"node_count_before", nodesBefore},
                           {"node_count", round.nodeCount}, {"node_rank", round.nodeRank},
                           {"rank_offset", round.rankOffset}});
  const bool growUntaken = std::all_of(began.lost.begin(), began.lost.end(), [](const LostWorker& l) { return l.signal == 0; });
  console.say("drun: {}; the job shrinks in place from {} to {} ranks ({} to {} nodes): generation {}, this node is "
              "node rank {} with ranks from {}\n",
              growUntaken ? "the place the job grew by (for " + lostNodes(began) + ") was not taken"
                          : lostNodes(began) + " was lost and no spare took its place",
              worldBefore, round.worldSize, nodesBefore, round.nodeCount, in.generation, round.nodeRank,
              round.rankOffset);
}

}  // namespace drun::agent

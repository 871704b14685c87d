// The elastic agent's grow in place (docs/recovery.md "Elastic in place"): under --recovery
// in-process with --nnodes MIN:MAX, a node that waits to join while the job runs below MAX (a
// newcomer, or a node a shrink dropped coming back) is taken in without a restart. Exactly one
// member claims the grow (Rendezvous::claimGrowth), opens a generation of kind grow (its world
// record keeps every rank and adds the newcomer's after them: node rank = node count, rank offset
// = world size) and offers the place as a lost node's is offered; the newcomer takes it as a
// spare takes a vacancy. The workers take the generation at their next commit (no failure: no
// pending operation is aborted). Every agent, learning of the generation, takes the larger world
// for what it starts later and says so. No unit of --max-restarts is spent. At recovery_timeout
// the claimer withdraws a place nobody took and the job shrinks back to the world it had
// (agent_node_recovery.cpp's fallBackLostNode, agent_shrink.cpp); a place taken whose generation
// did not form falls back to a restart, as any generation.
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "drun/rendezvous/backend.hpp"
#include "elastic_agent_impl.hpp"

namespace drun::agent {

using detail::Event;
using detail::Generation;

namespace {

// What claiming a grow came to, off the loop.
struct GrowthClaim {
  std::optional<rdzv::Vacancy> place;  // nullopt: nobody waits, the job is full, or a grow is open
  uint64_t generation = 0;
};

}  // namespace

Event ElasticAgent::Impl::nodeWaitingEvent() const {
  const bool canGrow = config.recovery.inProcess() && round.nodeCount < config.rendezvous.maxNodes &&
                       rdzv::capabilities(config.rendezvous.backend).sharedStore;
  return canGrow ? Event::GrowWanted : Event::NodeWaiting;
}

// A node waits to join: claim the round's next grow off the loop; the claimer opens its
// generation and offers the place.
void ElasticAgent::Impl::claimGrowth(const Input& in) {
  growDeferred = false;
  const uint64_t r = round.round;
  const std::string prefix = workerStore->prefix(r);
  const int nodeCount = round.nodeCount, worldSize = round.worldSize, count = jobRestarts;
  const std::string reason = in.reason;
  offLoopCall(
      [this, prefix, nodeCount, worldSize, count] {
        GrowthClaim claim;
        claim.place = rendezvous->claimGrowth(nodeCount, worldSize);
        if (!claim.place) return claim;
        rdzv::recovery::World world;
        for (int rank = 0; rank < worldSize; ++rank) world.ranks.push_back(rank);
        for (int node = 0; node < nodeCount; ++node) world.nodeRanks.push_back(node);
        world.addedRanks = claim.place->localWorldSize;
        world.addedNodes = 1;
        const std::string me = config.hostname + " pid " + std::to_string(::getpid()) + " (a grow)";
        try {
          claim.generation = detail::openGeneration(recoveryStore(), prefix, {}, me, count, config.recovery.timeout,
                                                    world);
        } catch (...) {
          recoveryConnection.reset();
          try {
            rendezvous->withdrawVacancy(*claim.place);  // never posted: nobody can take it
            rendezvous->endGrowth(*claim.place);
          } catch (const std::exception& e) {
            spdlog::debug("agent: ending a grow that did not open: {}", e.what());
          }
          throw;
        }
        // Begun: from here on the claimer decides at recovery_timeout (withdrawn: shrinks back).
        try {
          rendezvous->postVacancy(*claim.place, claim.generation, count);
        } catch (const std::exception& e) {
          spdlog::warn("agent: could not offer the grow's place of generation {}: {}", claim.generation, e.what());
        }
        return claim;
      },
      [this, r](const GrowthClaim& claim) {
        if (r != round.round || !claim.place) return;
        Input opened;
        opened.generation = claim.generation;
        opened.places = {*claim.place};
        opened.reason = "generation " + std::to_string(claim.generation);
        dispatch(Event::GrowthOpened, opened);
      },
      [this, r, reason](std::exception_ptr error) {
        if (r != round.round) return;
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          console.say("drun: {}; not taking it in: could not grow the job in place: {}\n", reason, e.what());
          note("scale_up_refused", {{"round", round.round}, {"reason", e.what()}});
        }
      });
}

// A node waits while a recovery is open: one generation at a time. Claimed once it formed.
void ElasticAgent::Impl::deferGrowth(const Input&) { growDeferred = true; }

// This node claimed the grow and opened its generation: it decides the place's deadline.
void ElasticAgent::Impl::offerGrowth(const Input& in) {
  const uint64_t g = in.generation;
  const rdzv::Vacancy& place = in.places.front();
  note("node_place_offered", {{"round", round.round}, {"generation", g}, {"grow", true},
                              {"places", place.node + " (node rank " + std::to_string(place.nodeRank) + ")"}});
  if (g < generation) {  // superseded before it came back here: nobody forms it
    withdrawGrowth(in);
    return;
  }
  opened = Opened{g, place.rankOffset, 0};
  offered = OfferedPlaces{g, in.places, false, true};
  armRecoveryDue(g, config.recovery.timeout);
}

// The grow was opened after this node began stopping (a failure, a loss, a signal): its place is
// withdrawn at once (the job re-forms anyway, and takes the waiting node in then).
void ElasticAgent::Impl::withdrawGrowth(const Input& in) {
  offLoop->post([this, places = in.places] {
    try {
      for (const rdzv::Vacancy& v : places) {
        rendezvous->withdrawVacancy(v);
        rendezvous->endGrowth(v);
      }
    } catch (const std::exception& e) {
      spdlog::debug("agent: withdrawing the grow's place: {}", e.what());
    }
  });
}

void ElasticAgent::Impl::endGrowth(const rdzv::Vacancy& place) {
  offLoop->post([this, place] {
    try {
      rendezvous->endGrowth(place);
    } catch (const std::exception& e) {
      spdlog::debug("agent: ending the grow: {}", e.what());
    }
  });
}

// Every node: a grow began. The larger world is what later replacements and the environment use.
void ElasticAgent::Impl::applyGrow(const Input& in) {
  const rdzv::recovery::World& world = *generations[in.generation].world;
  const int worldBefore = round.worldSize, nodesBefore = round.nodeCount;
  round.worldSize = world.size();
  round.nodeCount = world.nodeCount();
  if (round.hosts.size() == size_t(nodesBefore)) round.hosts.resize(size_t(round.nodeCount));
  note("recovery_grown", {{"round", round.round}, {"generation", in.generation}, {"world_size_before", worldBefore},
                          {"world_size", round.worldSize}, {"node_count_before", nodesBefore},
                          {"node_count", round.nodeCount}});
  console.say("drun: a node joins the running job in place: world {} -> {} ranks ({} -> {} nodes), generation {}; "
              "the workers take it at their next commit (restart count unchanged)\n",
              worldBefore, round.worldSize, nodesBefore, round.nodeCount, in.generation);
}

}  // namespace drun::agent

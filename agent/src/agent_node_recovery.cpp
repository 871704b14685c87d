// The elastic agent's part in replacing a lost node in place (docs/recovery.md "A lost node"):
// under --recovery in-process, a member node lost while this node runs does not stop its
// workers. The survivor that claims the loss (Rendezvous::claimLostMembers: one per loss) spends
// one unit of the budget, opens a recovery generation for the lost node's ranks and offers its
// place to a spare; at recovery_timeout it withdraws the offer and sets the generation's
// fallback (the job re-forms as under --recovery restart). A survivor that claimed nothing waits
// for the generation the claimer opens, and re-forms if none begins within recovery_timeout. The
// spare that takes the place starts its workers in that generation (prepareNodeRecovery).
#include <signal.h>

#include <algorithm>

#include <spdlog/spdlog.h>

#include "drun/common/progress.hpp"
#include "elastic_agent_impl.hpp"
#include "lost_node_news.hpp"

namespace drun::agent {

using detail::Event;
using detail::LostWorker;

namespace {

int64_t nowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// "node hostB (node rank 1, ranks 2..3)".
std::string describePlace(const rdzv::Vacancy& v) {
  const int last = v.rankOffset + v.localWorldSize - 1;
  return "node " + v.node + " (node rank " + std::to_string(v.nodeRank) + ", rank" +
         (last > v.rankOffset ? "s " + std::to_string(v.rankOffset) + ".." + std::to_string(last)
                              : " " + std::to_string(v.rankOffset)) +
         ")";
}

std::string describePlaces(const std::vector<rdzv::Vacancy>& places) {
  std::string out;
  for (const rdzv::Vacancy& v : places) out += (out.empty() ? "" : ", ") + describePlace(v);
  return out;
}

// The places as the job numbers them now: the shrinks and grows since each was numbered
// (Vacancy::numberedIn) renumber its node rank and ranks. A place one of them dropped was claimed
// before (its member lost then): it is not the job's any more and is left out.
std::vector<rdzv::Vacancy> numberedNow(rdzv::LivenessStore& store, const std::string& prefix,
                                       std::vector<rdzv::Vacancy> places) {
  if (places.empty()) return places;
  uint64_t oldest = places.front().numberedIn;
  for (const rdzv::Vacancy& v : places) oldest = std::min(oldest, v.numberedIn);
  const std::map<uint64_t, rdzv::recovery::World> worlds = detail::readWorldsAfter(store, prefix, oldest);
  std::vector<rdzv::Vacancy> now;
  for (rdzv::Vacancy& v : places) {
    std::vector<rdzv::recovery::World> since;
    for (auto at = worlds.upper_bound(v.numberedIn); at != worlds.end(); ++at) since.push_back(at->second);
    const auto place = rdzv::recovery::renumberPlace({v.nodeRank, v.rankOffset}, since);
    if (!place) {
      spdlog::warn("agent: the lost {}'s place (node rank {}) is not in the job's world any more", v.node, v.nodeRank);
      continue;
    }
    v.nodeRank = place->nodeRank;
    v.rankOffset = place->rankOffset;
    v.numberedIn = worlds.empty() ? v.numberedIn : std::max(v.numberedIn, worlds.rbegin()->first);
    now.push_back(std::move(v));
  }
  return now;
}

// What claiming the loss came to, off the loop.
struct LossClaim {
  std::vector<rdzv::Vacancy> places;  // claimed here (empty: another node handles the loss)
  uint64_t generation = 0;
  int restartCount = 0;
  bool budgetSpent = false;  // the generation was opened only to fall back at once
};

}  // namespace

Event ElasticAgent::Impl::memberLostEvent(Input& in) const {
  detail::LossSeen seen;
  seen.inProcess = config.recovery.inProcess();
  seen.running = state == AgentState::Running;
  seen.recovering = state == AgentState::Recovering;
  seen.lossOpen = lossOpen;
  seen.newest = generation;
  auto newest = generations.find(generation);
  seen.newestForLostNode = newest != generations.end() && !newest->second.lost.empty() &&
                           std::all_of(newest->second.lost.begin(), newest->second.lost.end(),
                                       [](const LostWorker& l) { return l.pid == 0; });
  const detail::LossNews news = detail::classifyLoss(seen);
  in.generation = news.itsGeneration;
  return news.keepWorkers ? Event::NodeLost : Event::MemberLost;
}

void ElasticAgent::Impl::prepareNodeRecovery(AttemptContext& context) {
  offered.reset();
  lossOpen = false;
  lossTimer.cancel();
  if (!config.recovery.inProcess() || round.generation == 0) return;
  // A spare that took a lost node's place: its workers join the generation the others re-form in.
  context.generation = round.generation;
  context.restartCount = round.generationRestartCount;
  jobRestarts = std::max(jobRestarts, round.generationRestartCount);
  rdzv::Vacancy place;
  place.node = config.hostname;
  place.nodeRank = round.nodeRank;
  place.rankOffset = round.rankOffset;
  place.localWorldSize = config.nprocPerNode;
  console.say("drun: taking {} in the running job: {}, generation {} (restart {} of {})\n",
              round.grew ? "a place it grows by" : "a lost node's place", describePlace(place), round.generation,
              round.generationRestartCount, config.rendezvous.maxRestarts);
  // Its claimer decides the fallback; should it be gone too (its loss is not news to this node:
  // it may have died before this node took the place), this node re-forms by itself.
  lossOpen = true;
  const uint64_t r = round.round, g = round.generation;
  lossTimer.expires_after(config.recovery.timeout);
  lossTimer.async_wait([this, r, g](const boost::system::error_code& ec) {
    if (ec || r != round.round || !lossOpen) return;
    Input due;
    due.reason = "generation " + std::to_string(g) + ", which this node joined in a lost node's place, did not form "
                 "within " + humanDuration(config.recovery.timeout) + " (--rdzv-conf recovery_timeout)";
    dispatch(Event::LossUnrecovered, due);
  });
}

// A member node was lost: claim its place off the loop; the claimer opens the generation.
void ElasticAgent::Impl::claimLostNode(const Input& in) {
  const uint64_t r = round.round;
  const uint64_t generationAtLoss = generation;
  const detail::LossNews news{true, in.generation};  // memberLostEvent's
  const std::string prefix = workerStore->prefix(r);
  const std::string reason = in.reason;
  lossOpen = true;
  // recovery_timeout from the loss: the claimer decides its generation's fallback (RecoveryDue);
  // any other survivor re-forms unless a recovery began meanwhile.
  lossTimer.expires_after(config.recovery.timeout);
  lossTimer.async_wait([this, r, generationAtLoss, news, reason](const boost::system::error_code& ec) {
    if (ec || r != round.round || !lossOpen) return;  // formed meanwhile
    Input due;
    if (offered) {
      due.generation = offered->generation;
      if (opened && opened->generation == due.generation) dispatch(Event::RecoveryDue, due);
      return;
    }
    if (detail::lossRecoveryBegan(news, generationAtLoss, generation)) return;
    due.reason = reason + "; no recovery of it began within " + humanDuration(config.recovery.timeout) +
                 " (--rdzv-conf recovery_timeout)";
    dispatch(Event::LossUnrecovered, due);
  });
  ++opensInFlight;
  offLoopCall(
      [this, prefix] {
        LossClaim claim;
        try {
          claim.places = numberedNow(recoveryStore(), prefix, rendezvous->claimLostMembers());
        } catch (...) {
          recoveryConnection.reset();
          throw;
        }
        if (claim.places.empty()) return claim;
        std::vector<LostWorker> lost;
        for (const rdzv::Vacancy& v : claim.places)
          for (int local = 0; local < v.localWorldSize; ++local)
            lost.push_back({v.rankOffset + local, local, v.node, 0, SIGKILL, 0, nowMs()});
        const std::string me = config.hostname + " pid " + std::to_string(::getpid()) + " (a lost node)";
        std::optional<int> count = rendezvous->spendRecovery();
        claim.budgetSpent = !count;
        claim.restartCount = count.value_or(jobRestarts);
        try {
          claim.generation =
              detail::openGeneration(recoveryStore(), prefix, lost, me, claim.restartCount, config.recovery.timeout);
          if (claim.budgetSpent) {
            detail::decideFallback(recoveryStore(), prefix, claim.generation,
                                   "no in-process recovery: the job's restart budget (--max-restarts " +
                                       std::to_string(config.rendezvous.maxRestarts) + ") is spent");
            return claim;
          }
          for (const rdzv::Vacancy& v : claim.places) rendezvous->postVacancy(v, claim.generation, claim.restartCount);
        } catch (...) {
          recoveryConnection.reset();
          if (!claim.budgetSpent) try {
              rendezvous->refundRecovery();
            } catch (const std::exception& e) {
              spdlog::debug("agent: taking the recovery off the budget again: {}", e.what());
            }
          throw;
        }
        return claim;
      },
      [this, r](const LossClaim& claim) {
        if (r != round.round) return;
        --opensInFlight;
        if (claim.places.empty() || claim.budgetSpent) return;  // the generation (or its fallback) tells
        Input opened;
        opened.generation = claim.generation;
        opened.restartCount = claim.restartCount;
        opened.places = claim.places;
        opened.reason = "generation " + std::to_string(claim.generation);
        dispatch(Event::NodeRecoveryOpened, opened);
      },
      [this, r, reason](std::exception_ptr error) {
        if (r != round.round) return;
        --opensInFlight;
        Input failed;
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          failed.reason = reason + "; could not offer its place to a spare: " + e.what();
        }
        dispatch(Event::LossUnrecovered, failed);
      });
}

// This node opened the generation for the lost node(s) and offered their places: it decides the
// fallback at recovery_timeout, counted from the loss.
void ElasticAgent::Impl::offerLostPlaces(const Input& in) {
  const uint64_t g = in.generation;
  opened = Opened{g, in.places.front().rankOffset, 0};
  offered = OfferedPlaces{g, in.places};
  jobRestarts = std::max(jobRestarts, in.restartCount);
  console.say("drun: {} was lost; the other nodes' workers go on, and its place is offered to a spare: generation "
              "{} (restart {} of {})\n",
              describePlaces(in.places), g, in.restartCount, config.rendezvous.maxRestarts);
  note("node_place_offered", {{"round", round.round}, {"generation", g}, {"places", describePlaces(in.places)}});
  // lossTimer, armed at the loss, brings RecoveryDue at recovery_timeout.
}

// The places were offered after this node began stopping: nobody decides their deadline now, so
// they are withdrawn at once and their unit goes back to the budget (the job re-forms anyway).
void ElasticAgent::Impl::withdrawLostPlaces(const Input& in) {
  offLoop->post([this, places = in.places] {
    try {
      bool withdrawn = false;
      for (const rdzv::Vacancy& v : places) withdrawn = rendezvous->withdrawVacancy(v) || withdrawn;
      if (withdrawn) rendezvous->refundRecovery();
    } catch (const std::exception& e) {
      spdlog::debug("agent: withdrawing the lost node's place: {}", e.what());
    }
  });
}

// recovery_timeout passed for a generation opened for lost nodes: the offers are withdrawn and
// the generation's unit goes back to the budget (a membership change spends no restart); then
// fallBack records the fallback as for a worker death (the reason: no spare came, or who did
// not join), and it re-forms the job everywhere.
void ElasticAgent::Impl::fallBackLostNode(const Input& in) {
  const uint64_t g = in.generation, r = round.round;
  const std::vector<rdzv::Vacancy> places = offered->places;
  const bool grow = offered->grow;
  offered->withdrawn = true;
  const std::string waited = humanDuration(config.recovery.timeout);
  offLoop->post([this, in, r, g, places, waited, grow] {
    std::string why;
    bool noneTaken = false;
    try {
      std::vector<rdzv::Vacancy> untaken;
      for (const rdzv::Vacancy& v : places)
        if (rendezvous->withdrawVacancy(v)) untaken.push_back(v);
      noneTaken = untaken.size() == places.size();
      if (!untaken.empty())
        why = "no spare took the place of " + describePlaces(untaken) + " within " + waited +
              " (--rdzv-conf recovery_timeout)";
      // A grow spent no unit; once decided, the next grow can be claimed.
      if (grow) rendezvous->endGrowth(places.front());
      else rendezvous->refundRecovery();
    } catch (const std::exception& e) {
      spdlog::debug("agent: withdrawing the lost node's place: {}", e.what());
    }
    onLoop([this, in, r, g, why, places, noneTaken] {
      if (r != round.round || g < generation) return;
      Input due = in;
      due.reason = why;  // "": fallBack says who did not join
      if (noneTaken && canShrinkWithout(places)) return shrinkInPlace(due, places);  // agent_shrink.cpp
      fallBack(due);
    });
  });
}

}  // namespace drun::agent

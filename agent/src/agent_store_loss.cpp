// The rendezvous store lost while this node's workers run (a drun-rendezvous daemon restarted or
// upgraded). Nothing about the running round changed, so its workers need not stop:
//
//   Running --store lost--> Reconnecting: reconnectAfterLoss() off the loop, workers running
//     store restarted empty (every member lost it; this node refilled it): join with the
//       workers running; the round that forms decides, alike on every member:
//         RoundResult::continuesPrevious (same members, node ranks, restart count): Running,
//           the same workers in the new round
//         else (a member did not come back, a newcomer, a failure carried): StoppingForRound,
//           then the new round's workers
//     store still held the job (only this node lost it: the others may re-form without it),
//     or no store within heartbeat_timeout (the others' bound for calling it lost): the
//       workers are fenced (stopped) and the node rejoins, as after any store loss
//
// Only on the c10d backend: an etcd cluster that comes back still holds the job. Under
// --recovery in-process the workers' store is the one that was lost (their generations with it):
// the node keeps its workers only while no recovery is open (Running, no generation being
// opened); its recovery watch stops with the store, the refill carries the restart count this
// node knows (its recoveries included), and once the round continues the agent writes the
// generations' records again under the workers' prefix (refillGenerations) and watches them
// anew, so that a later death still recovers in place.
//
// While the store is away, a worker's exit is held: it is dispatched again in the round that
// forms (a failure is reported there and spends the budget, a success waits in its exit barrier).
#include <spdlog/spdlog.h>

#include <utility>

#include "elastic_agent_impl.hpp"

namespace drun::agent {

bool ElasticAgent::Impl::keepsWorkersThroughStoreLoss() const {
  return state == AgentState::Running && (!config.recovery.inProcess() || opensInFlight == 0) &&
         config.rendezvous.backend == rdzv::RendezvousBackend::C10d && group;
}

void ElasticAgent::Impl::reconnectKeepingWorkers(const Input& in) {
  const auto fence = config.rendezvous.heartbeatTimeout;
  console.say("drun: {}; the workers keep running while this node reconnects (stopped if the store is not back "
              "within {}: heartbeat_timeout)\n",
              in.reason, humanDuration(fence));
  scaleUpTimer.cancel();
  stopRecoveryWatch();  // its connections went with the store: watched anew if the round continues
  note("store_lost_workers_kept", {{"round", round.round}, {"reason", in.reason}});
  storeRefilled = false;
  fenceTimer.expires_after(fence);
  fenceTimer.async_wait([this, fence](const boost::system::error_code& ec) {
    if (ec || state != AgentState::Reconnecting || storeRefilled) return;
    Input due;
    due.reason = "the rendezvous store was not back within " + humanDuration(fence) + " (heartbeat_timeout)";
    dispatch(Event::FenceDue, due);
  });
  ++joinsInFlight;
  offLoopCall([this, known = jobRestarts] { return rendezvous->reconnectAfterLoss(known); },
              [this](bool refilled) {
                --joinsInFlight;
                Input back;
                back.reason = refilled ? "the rendezvous store restarted empty; this node refilled it"
                                       : "the rendezvous store still held the job: the others may go on "
                                         "without this node";
                dispatch(refilled ? Event::StoreRefilled : Event::StoreKeptJob, back);
              },
              [this](std::exception_ptr error) {
                --joinsInFlight;
                Input failed;
                try {
                  std::rethrow_exception(error);
                } catch (const std::exception& e) {
                  failed.reason = e.what();
                }
                dispatch(Event::RendezvousFailed, failed);
              });
}

void ElasticAgent::Impl::rejoinKeepingWorkers(const Input& in) {
  storeRefilled = true;
  fenceTimer.cancel();
  spdlog::debug("agent: {}; rejoining with the workers running", in.reason);
  joinRound(in);
}

// Fencing: this node cannot know whether the others went on without it.
void ElasticAgent::Impl::fenceWorkers(const Input& in) {
  fenceTimer.cancel();
  stopToReform(in);
}

void ElasticAgent::Impl::sayRendezvousFailed(const Input& in) {
  console.say("drun: error: rendezvous failed: {}\n", in.reason);
}

void ElasticAgent::Impl::compareRound(const Input& in) {
  dispatch(in.round->continuesPrevious ? Event::RoundContinues : Event::RoundChanged, in);
}

void ElasticAgent::Impl::keepWorkers(const Input& in) {
  const rdzv::RoundResult before = round;
  round = *in.round;
  // The workers were started with the earlier round's master: theirs stays in use.
  round.masterAddr = before.masterAddr;
  round.masterPort = before.masterPort;
  console.say("drun: the rendezvous store is back: round {} carries round {} on with the same {} node(s); the "
              "workers kept running\n",
              round.round, before.round, round.nodeCount);
  notes->roundContinued(round, before.round);
  shareLearnedTimeouts();
  if (config.recovery.inProcess()) keepWorkersStore(before.round);
  std::vector<rdzv::JobEvent> pending;
  pending.swap(latched);
  for (const rdzv::JobEvent& e : pending)
    if (e.round == round.round) onJobEvent(e);
  if (state != AgentState::Running) return;  // a latched event moved on (a failure elsewhere)
  // What the workers did while the join ran, as if it happened now.
  if (rootCause) {
    Input failed;
    failed.exit = rootCause;
    failed.reason = "rank " + std::to_string(rootCause->globalRank);
    dispatch(Event::WorkerFailed, failed);
  } else if (group->running() == 0) {
    dispatch(Event::WorkersSucceeded);
  }
}

// The workers go on with the prefix of the round they were started in; the store lost what it
// held there. Written again (on the OffLoop thread, before any later opening there) and watched
// anew.
void ElasticAgent::Impl::keepWorkersStore(uint64_t workersRound) {
  workerStore->carryOn(round.round, workersRound);
  offLoop->post([this, prefix = workerStore->prefix(round.round), known = generations, current = generation] {
    recoveryConnection.reset();  // it went with the store
    try {
      detail::refillGenerations(recoveryStore(), prefix, known, current);
    } catch (const std::exception& e) {
      recoveryConnection.reset();
      spdlog::warn("agent: could not write the recovery generations again into the restarted store: {}", e.what());
    }
  });
  startRecoveryWatch();
}

void ElasticAgent::Impl::holdWhileReconnecting(const Input& in) {
  spdlog::debug("agent: {} while rejoining: held until the round forms", in.reason.empty() ? "workers ended" : in.reason);
}

void ElasticAgent::Impl::stopForNewRound(const Input& in) {
  newRound = *in.round;
  console.say("drun: the rendezvous store is back, but round {} is not the one these workers run (other "
              "members, or a failure carried in its restart count); stopping them and starting the new round's\n",
              in.round->round);
  stopGroup(SIGTERM);
}

void ElasticAgent::Impl::startNewRound(const Input&) {
  Input in;
  in.round = std::exchange(newRound, std::nullopt);
  in.reason = "round " + std::to_string(in.round->round);
  startWorkers(in);
}

void ElasticAgent::Impl::stopStoreGone(const Input& in) {
  fenceTimer.cancel();
  console.say("drun: error: rendezvous failed: {}; stopping the workers\n", in.reason);
  stopGroup(SIGTERM);
}

}  // namespace drun::agent

// The elastic agent's actions: what each rule of the table (elastic_agent.cpp) does after its
// transition. Each runs on the loop; a blocking rendezvous call goes off the loop (offLoopCall)
// and comes back as an event.
#include <signal.h>

#include <spdlog/spdlog.h>

#include "drun/agent/failure_summary.hpp"
#include "drun/common/error.hpp"
#include "drun/common/log.hpp"
#include "drun/common/progress.hpp"
#include "elastic_agent_impl.hpp"
#include "event_fields.hpp"

namespace drun::agent {

namespace fs = std::filesystem;
using detail::Event;
using rdzv::FailureRecord;
using rdzv::JobEvent;

void ElasticAgent::Impl::joinRound(const Input&) {
  note("node_joining", {{"round", attempt == 0 ? nlohmann::json() : nlohmann::json(round.round)}});
  shareLearnedTimeouts();
  ++joinsInFlight;
  offLoopCall([this] { return rendezvous->next(); },
              [this](const rdzv::RoundResult& r) {
                --joinsInFlight;
                Input in;
                in.round = r;
                in.reason = "round " + std::to_string(r.round);
                dispatch(Event::RoundFormed, in);
              },
              [this](std::exception_ptr error) {
                --joinsInFlight;
                Input in;
                try {
                  std::rethrow_exception(error);
                } catch (const rdzv::JobEnded& e) {
                  in.reason = e.what();
                  in.code = e.exitCode();
                  dispatch(in.code == 0 ? Event::JobEndedOk : Event::JobEnded, in);
                  return;
                } catch (const std::exception& e) {
                  in.reason = e.what();
                }
                dispatch(Event::RendezvousFailed, in);
              });
}

// --hang-timeout auto: what this node learned goes into the store before it joins a round
// (queued before the join on the same thread: the round cannot form before every member's
// values are in), and the job's merge (every node's ranks, every earlier round: the longest
// intervals) comes back once the round runs, so that every node uses the same timeouts and a
// restart or a replacement node forgets nothing.
void ElasticAgent::Impl::shareLearnedTimeouts() {
  if (!config.hangs.learn) return;
  offLoop->post([this, mine = learnedTimeouts] {
    try {
      std::string merged = rendezvous->mergeShared("hang timeouts learned", [&](const std::string& theirs) {
        detail::LearnedTimeouts both = mine;
        both.mergeEncoded(theirs);
        return both.encode();
      });
      onLoop([this, merged] { learnedTimeouts.mergeEncoded(merged); });
    } catch (const std::exception& e) {
      spdlog::debug("agent: sharing the learned hang timeouts: {}", e.what());
    }
  });
}

void ElasticAgent::Impl::sayLearned(const detail::LearnedNote& n) {
  const std::string what = n.key.empty() ? "heartbeats" : "section \"" + n.key + "\"";
  const std::string rule = n.floor ? "the floor" : std::to_string(static_cast<int>(config.hangs.factor)) + "x";
  console.say("drun: hang timeout learned for {}: {} ({}; the longest {} seen {})\n", what,
              detail::humanSeconds(n.timeout), rule, n.key.empty() ? "interval" : "duration",
              detail::humanSeconds(n.longest));
  note("hang_timeout_learned", {{"key", n.key}, {"timeout_ms", n.timeout.count()},
                                {"longest_ms", n.longest.count()}, {"floor", n.floor}});
}

// A learned timeout called the hang that failed the job: the restarted job learns afresh (a
// pause it never saw, an evaluation, would be called a hang again and again). The next share
// carries the new generation to the store, which drops every node's older values.
void ElasticAgent::Impl::forgetLearnedTimeouts(const FailureRecord& cause) {
  if (!config.hangs.learn || !isLearnedHang(cause)) return;
  learnedTimeouts.forget();
  console.say("drun: forgetting the learned hang timeouts: the restarted job learns them afresh\n");
  note("hang_timeouts_forgotten", {{"rank", cause.rank}});
}

void ElasticAgent::Impl::startWorkers(const Input& in) {
  round = *in.round;
  log::setField("node", std::to_string(round.nodeRank));  // on drun's JSON log lines from now on
  spdlog::debug("agent: round {} node {}/{} world {} offset {} master {}:{} restart {}",
                round.round, round.nodeRank, round.nodeCount, round.worldSize, round.rankOffset,
                round.masterAddr, round.masterPort, round.restartCount);
  attemptDir = jobDir->prepareAttempt(round.nodeRank, attempt, config.nprocPerNode);

  AttemptContext context;
  context.restartCount = round.restartCount;
  context.attemptDir = attemptDir;
  context.baseEnvironment = baseEnvironment;
  context.cpuCount = cpuCount;
  context.bindings = numaBindings;
  context.channels = hangMonitor->prepare(attemptDir, config.nprocPerNode);
  context.pythonPackageDir = pythonPackageDir;
  context.timerFile = hangMonitor->timerFile();
  prepareRecovery(context);
  prepareNodeRecovery(context);
  attemptContext = context;
  std::vector<WorkerSpec> specs = buildWorkerSpecs(config, round, context);

  rootCause.reset();
  otherFailures = 0;
  scaleUpTimer.cancel();
  // A spare that took a place with standbys waiting (agent_spare.cpp) starts in their group.
  const bool inPlace = takesPlaceWithStandbys();
  if (!inPlace) {
    standbys.reset();
    group.reset();
    group = std::make_unique<WorkerGroup>(io, groupOptions(round.worldSize, attemptDir));
    group->onExit([this](const WorkerExit& exit) { onWorkerExit(exit); });
  }
  ++attempt;
  PlaceWorkers started;
  try {
    if (inPlace) {
      started = startPlaceWorkers(specs);
    } else {
      group->start(specs);
      started.pids = group->pids();
    }
  } catch (const std::exception& e) {
    throw Error(std::string("could not start the workers: ") + e.what());
  }
  hangMonitor->start(started.pids, config.isPython,
                     [this](const detail::HangReport& r) { sayHung(r); }, round.rankOffset);
  startRecoveryWatch();
  if (inPlace)
    keepSpareStandbys();
  else
    startStandbys();
  notes->roundStarted(round, started.pids, attempt, started.fromStandby);
  shareLearnedTimeouts();
  // Events of this round that arrived while it was forming.
  std::vector<JobEvent> pending;
  pending.swap(latched);
  for (const JobEvent& e : pending)
    if (e.round == round.round) onJobEvent(e);
}

void ElasticAgent::Impl::sayHung(const detail::HangReport& r) {
  console.say("drun: rank {} (local_rank {}) on {} hung: {}; taking its stack and stopping it\n",
      round.rankOffset + r.localRank, r.localRank, config.hostname,
      r.verdict.describe());
}

void ElasticAgent::Impl::stopGroup(int signal) {
  hangMonitor->stop();
  stopStandbys();
  stopRecoveryWatch();
  scaleUpTimer.cancel();
  cancelWindow.reset();  // the exits it held are consequences of this stop now
  cancelTimer.cancel();
  group->stop(signal, config.shutdownTimeout, [this] { dispatch(Event::WorkersStopped); });
}

void ElasticAgent::Impl::stopWorkers(const Input&) { stopGroup(SIGTERM); }

void ElasticAgent::Impl::stopToReform(const Input& in) {
  console.say("drun: {}; stopping the workers and re-forming the job\n",
               in.reason);
  stopGroup(SIGTERM);
}

void ElasticAgent::Impl::stopForRemoteFailure(const Input& in) {
  const FailureRecord& f = *in.failure;
  if (f.final) finalCause = f;
  console.say("drun: rank {} on {} failed ({}); stopping the workers{}\n", f.rank,
               f.node, describeStatus(f),
               f.final ? "" : " and restarting the job");
  stopGroup(SIGTERM);
}

void ElasticAgent::Impl::noteFinalCause(const Input& in) { finalCause = *in.failure; }

void ElasticAgent::Impl::stopForSignal(const Input& in) {
  noteCancelBy(in.signal);
  signalled = in.signal;
  signalledAt = Clock::now();
  const std::string name = signalName(in.signal);
  console.say("drun: received {}; stopping the workers ({} of grace, then SIGKILL; a second {} kills "
      "them now)\n", name, humanDuration(config.shutdownTimeout), name);
  stopGroup(in.signal);
}

// A signal while already stopping to exit. The same signal twice within kRepeatWindow is one
// request (`timeout` signals drun and then its process group): the grace period stands.
void ElasticAgent::Impl::killNow(const Input& in) {
  if (!signalled) return stopForSignal(in);  // stopping after a failure: the first signal
  if (Clock::now() - signalledAt < detail::kRepeatWindow) {
    spdlog::debug("agent: {} again within {} ms of the first: the grace period stands",
                  signalName(in.signal), detail::kRepeatWindow.count());
    return;
  }
  console.say("drun: second {}: killing the workers now\n", signalName(in.signal));
  group->stop(SIGKILL, std::chrono::milliseconds(0), [this] { dispatch(Event::WorkersStopped); });
}

void ElasticAgent::Impl::armScaleUp(const Input& in) {
  if (scaleUpTimer.expiry() > boost::asio::steady_timer::clock_type::now()) return;  // armed
  console.say("drun: {}; taking it in after the last call ({} ms)\n",
               in.reason,
               static_cast<long long>(config.rendezvous.lastCallTimeout.count()));
  scaleUpTimer.expires_after(config.rendezvous.lastCallTimeout);
  const uint64_t armedIn = round.round;
  scaleUpTimer.async_wait([this, armedIn](const boost::system::error_code& ec) {
    if (ec || armedIn != round.round) return;
    Input due;
    due.reason = "last call for the waiting node(s) passed";
    dispatch(Event::ScaleUpDue, due);
  });
}

// The last call passed: the round is claimed for the scale-up before the workers stop (a
// member that finished first keeps them running: rdzv::Rendezvous::claimScaleUp).
void ElasticAgent::Impl::claimScaleUp(const Input& in) {
  const uint64_t claimedIn = round.round;
  offLoopCall([this] { return rendezvous->claimScaleUp(); },
              [this, in, claimedIn](bool claimed) {
                if (claimedIn != round.round) return;  // that round ended meanwhile
                // Refused: the reason is the finished member, not the last call's passing.
                if (claimed) dispatch(Event::ScaleUpClaimed, in);
                else dispatch(Event::ScaleUpRefused, Input{});
              },
              [this, claimedIn](std::exception_ptr error) {
                if (claimedIn != round.round) return;
                Input refused;
                try {
                  std::rethrow_exception(error);
                } catch (const std::exception& e) {
                  refused.reason = std::string("could not claim the round for it: ") + e.what();
                }
                dispatch(Event::ScaleUpRefused, refused);
              });
}

// The waiting nodes are not taken in: they learn the job's end (or join a later round, if a
// failure or a loss re-forms it).
void ElasticAgent::Impl::keepRunning(const Input& in) {
  const std::string reason = in.reason.empty() ? "a node of this job already finished" : in.reason;
  console.say("drun: not taking the waiting node(s) in: {}; the workers go on\n", reason);
  note("scale_up_refused", {{"round", round.round}, {"reason", reason}});
}

void ElasticAgent::Impl::reportFailure(const Input&) {
  const WorkerExit& cause = *rootCause;
  FailureRecord record = makeFailureRecord(
      cause, config.hostname, errorFilePath(attemptDir, cause.localRank), otherFailures,
      /*showPath=*/!jobDir->temporary());
  if (const detail::HangReport* hang = hangMonitor->report(cause.localRank))
    markHang(record, hang->verdict.describe(), hang->stackHow, hang->stackText, hang->blame);
  // A console that is gone (`drun ... | head`: its workers died of SIGPIPE) is not a failure to
  // retry: the job ends, as a shell pipeline does once its reader exits.
  record.final = console.gone();
  offLoopCall([this, record] { return rendezvous->reportFailure(record); },
              [this, record](const FailureRecord& verdict) {
                notes->rootCause(verdict, round);
                Input in;
                in.failure = verdict;
                dispatch(verdict.final ? Event::VerdictFinal : Event::VerdictRestart, in);
              },
              [this, record](std::exception_ptr error) {
                // Nobody can be told: end the job here with this node's root cause.
                Input in;
                in.failure = record;
                in.failure->final = true;
                try {
                  std::rethrow_exception(error);
                } catch (const std::exception& e) {
                  console.say("drun: error: could not report the failure: {}\n", e.what());
                }
                dispatch(Event::VerdictFinal, in);
              });
}

void ElasticAgent::Impl::restartAfterFailure(const Input& in) {
  const FailureRecord& f = *in.failure;
  console.say(
               "drun: rank {} (local_rank {}) on {} failed ({}); restarting the job "
               "(restart {} of {})\n",
               f.rank, f.localRank, f.node, describeStatus(f),
               jobRestarts + (fellBack ? 0 : 1), config.rendezvous.maxRestarts);
  forgetLearnedTimeouts(f);
  joinRound(in);
}

void ElasticAgent::Impl::rejoinAfterRemoteFailure(const Input& in) {
  const FailureRecord& f = *in.failure;
  console.say("drun: rank {} on {} failed ({}); restarting the job\n", f.rank,
               f.node, describeStatus(f));
  forgetLearnedTimeouts(f);
  joinRound(in);
}

void ElasticAgent::Impl::rejoinToReform(const Input& in) {
  console.say("drun: {}; re-forming the job\n", in.reason);
  joinRound(in);
}

// While this node waits in the exit barrier, say so at the rendezvous' progress pace.
void ElasticAgent::Impl::sayStillFinishing(Clock::time_point since) {
  barrierTimer.expires_after(config.rendezvous.progressInterval);
  barrierTimer.async_wait([this, since](const boost::system::error_code& ec) {
    if (ec || state != AgentState::Finishing) return;
    console.say("drun: still waiting for the other node(s) of the job to finish ({} so far)\n",
        humanDuration(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since)));
    sayStillFinishing(since);
  });
}

void ElasticAgent::Impl::reportFinished(const Input&) {
  hangMonitor->stop();
  stopStandbys();  // the workers are done: nothing left to take a place in
  // No worker of this node joins a generation any more, and the workers' store closes as the job
  // ends, which the watch must not report as lost; unless a lost node's recovery is open (its
  // fallback re-forms this node too: agent_node_recovery.cpp).
  if (!lossOpen) stopRecoveryWatch();
  if (round.nodeCount > 1 && !rdzv::capabilities(config.rendezvous.backend).sharedStore) {
    // No store, no exit barrier: nothing to wait for (torchrun's static backend alike).
    console.say("drun: this node's workers succeeded; with the static rendezvous each node ends on its "
        "own (the other {} node(s) are not waited for)\n", round.nodeCount - 1);
  } else if (round.nodeCount > 1) {
    console.say("drun: this node's workers succeeded; waiting for the other {} node(s) of the job\n",
        round.nodeCount - 1);
    sayStillFinishing(Clock::now());
  }
  offLoop->post([this] {
    try {
      if (rendezvous->finish()) return;  // the Succeeded event follows through the job's events
      onLoop([this] {
        Input in;
        in.reason = "a node of the job took waiting node(s) in before this node's workers "
                    "succeeded";
        dispatch(Event::ScaleUpClaimed, in);
      });
    } catch (const std::exception& e) {
      std::string what = e.what();
      onLoop([this, what] {
        Input in;
        in.reason = "lost the rendezvous store while waiting for the other nodes: " + what;
        dispatch(Event::StoreLost, in);
      });
    }
  });
}

void ElasticAgent::Impl::exitSucceeded(const Input&) {
  exitCode = 0;
  note("job_succeeded", {{"round", round.round}, {"code", 0}});
  leaveAndStop(true);
}

void ElasticAgent::Impl::exitFailed(const Input& in) {
  if (signalled) {
    exitCode = 128 + signalled;
    noteSignalledEnd();
    leaveAndStop(false);
    return;
  }
  if (in.failure) finalCause = *in.failure;
  printFinalCause();
  note("job_failed", {{"round", round.round}, {"code", exitCode},
                      {"root_cause", finalCause ? detail::failureJson(*finalCause) : nlohmann::json()}});
  leaveAndStop(true);
}

void ElasticAgent::Impl::printFinalCause() {
  if (!finalCause) {
    exitCode = 1;
    return;
  }
  console.sayFinalCause(*finalCause, config);
  exitCode = finalCause->statusCode();
}

// The join has returned (with an error): leaving is clean, so that a node hosting the store
// keeps serving the others (bounded by close_timeout) until they have their answer too.
void ElasticAgent::Impl::exitRendezvousFailed(const Input& in) {
  console.say("drun: error: rendezvous failed: {}\n", in.reason);
  exitCode = 1;
  note("job_failed", {{"code", exitCode}, {"reason", in.reason}});
  leaveAndStop(true);
}

// A spare or a late joiner learned the job's end: it leaves as a known node of the job (the
// store's host, if that is this node, serves until the others left too).
void ElasticAgent::Impl::exitJobEnded(const Input& in) {
  console.say("drun: {}\n", in.reason);
  exitCode = in.code;
  note(in.code == 0 ? "job_succeeded" : "job_failed", {{"code", in.code}, {"reason", in.reason}});
  leaveAndStop(true);
}

void ElasticAgent::Impl::exitSignalled(const Input& in) {
  noteCancelBy(in.signal);
  signalled = in.signal;
  console.say("drun: received {}; leaving the job\n", signalName(in.signal));
  exitCode = 128 + in.signal;
  noteSignalledEnd();
  leaveAndStop(false);
}

// A signal while the join blocks (it may block up to the join timeout): not waited for.
void ElasticAgent::Impl::exitSignalledWhileJoining(const Input& in) {
  noteCancelBy(in.signal);
  signalled = in.signal;
  console.say("drun: received {}; leaving the job\n", signalName(in.signal));
  exitCode = 128 + in.signal;
  noteSignalledEnd();
  leaveAndStop(false);
}

// Leaves the job off the loop (clean: it ended for everyone; else as a lost node, so the
// others re-form), then ends the loop. The leave is queued behind the rendezvous call in
// flight (a failure report, finish()): leave() always follows finish(), so the store's host
// runs its exit barrier even when the job's Succeeded event overtook its own finish(). Only a
// join in flight (joinsInFlight: every rule into Rendezvous posts one) is not waited for: the
// loop ends at once, and run() returns with the join left running (Impl::leftRunning); the
// process's exit closes its connection, whose will tells the others.
void ElasticAgent::Impl::leaveAndStop(bool clean) {
  if (joinsInFlight > 0) {
    io.stop();
    return;
  }
  offLoop->post([this, clean] {
    // The job's history is written before this node leaves: the last one out removes the
    // job's keys, and an event after that would leave one behind.
    if (notes) notes->flush();
    try {
      if (clean)
        rendezvous->leave();
      else
        rendezvous->abandon();
    } catch (const std::exception& e) {
      spdlog::debug("agent: leaving the job: {}", e.what());
    } catch (...) {
    }
    onLoop([this] { io.stop(); });
  });
}

}  // namespace drun::agent

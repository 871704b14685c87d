// The elastic agent's in-process recovery (docs/recovery.md): the actions of the Recovering rules
// in kRules (elastic_agent.cpp) and the inputs that feed them (the RecoveryWatch's reports).
// A worker of this node that fails while the node runs opens a generation (off the loop: one unit
// of the job's budget, then the generation's keys), is replaced by a new process with the same
// ranks, and the agent waits for the generation's outcome up to recovery_timeout; at the
// deadline it records the fallback, and the job restarts as under --recovery restart. Every
// node learns of every generation and outcome through its RecoveryWatch.
#include <signal.h>

#include <algorithm>

#include <spdlog/spdlog.h>

#include "drun/agent/failure_summary.hpp"
#include "drun/rendezvous/recovery_keys.hpp"
#include "elastic_agent_impl.hpp"

namespace drun::agent {

using detail::Event;
using detail::Generation;
using detail::LostWorker;

namespace {

int64_t wallMs(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

// "exit code 3" / "signal SIGKILL", as the failure summary says it.
std::string statusText(int exitCode, int signal) {
  rdzv::FailureRecord record;
  record.exitCode = exitCode;
  record.signal = signal;
  return describeStatus(record);
}

std::string rankList(const std::vector<LostWorker>& lost) {
  std::string out;
  for (const LostWorker& l : lost) out += (out.empty() ? "" : ", ") + std::to_string(l.rank);
  return out;
}

struct OpenResult {
  uint64_t generation = 0;  // 0: the budget is spent
  int restartCount = 0;
};

}  // namespace

// ---- inputs -----------------------------------------------------------------------------------

Event ElasticAgent::Impl::recoveryEventFor(const WorkerExit& exit, Input& in) {
  if (!config.recovery.inProcess() || (state != AgentState::Running && state != AgentState::Recovering))
    return Event::WorkerFailed;
  if (opened && opened->replacement == exit.pid && opened->generation == generation) {
    in.generation = generation;
    in.reason = "the replacement of rank " + std::to_string(exit.globalRank) + " ended (" +
                statusText(exit.exitCode, exit.signal) + ") before generation " + std::to_string(generation) +
                " formed";
    return Event::ReplacementFailed;
  }
  return Event::WorkerToReplace;
}

void ElasticAgent::Impl::onGenerationBegan(uint64_t forRound, const Generation& began) {
  if (forRound != round.round || began.number <= generation) return;
  generation = began.number;
  generations[began.number] = began;
  Input in;
  in.generation = began.number;
  in.restartCount = began.restartCount;
  in.reason = "generation " + std::to_string(began.number);
  dispatch(Event::GenerationBegan, in);
}

void ElasticAgent::Impl::onRecoveryOutcome(uint64_t forRound, uint64_t g, const std::string& value) {
  if (forRound != round.round || g != generation) return;  // an older generation's, superseded
  rdzv::recovery::Outcome outcome;
  try {
    outcome = rdzv::recovery::parseOutcome(value);
  } catch (const std::exception& e) {
    spdlog::warn("agent: generation {}: {}", g, e.what());
    return;
  }
  Input in;
  in.generation = g;
  in.reason = outcome.formed ? "generation " + std::to_string(g) + " formed" : outcome.reason;
  if (outcome.formed) {
    // A death that is opening the next generation right now: that one decides.
    if (opensInFlight > 0) return;
    dispatch(Event::RecoveryFormed, in);
    return;
  }
  const bool mine = opened && opened->generation == g && rootCause;
  dispatch(mine ? Event::RecoveryFellBack : Event::PeerRecoveryFellBack, in);
}

// ---- the round's recovery state -----------------------------------------------------------

void ElasticAgent::Impl::prepareRecovery(AttemptContext& context) {
  stopRecoveryWatch();
  recoveryTimer.cancel();
  generation = 0;
  generations.clear();
  opened.reset();
  opensInFlight = 0;
  fellBack.reset();
  jobRestarts = round.restartCount;
  if (!config.recovery.inProcess()) return;
  if (!workerStore) workerStore = std::make_unique<detail::WorkerStore>(config, *rendezvous);
  context.workerStore = workerStore->endpoint();
  context.workerStorePrefix = workerStore->prefix(round.round);
  context.generation = 0;
}

void ElasticAgent::Impl::startRecoveryWatch() {
  if (!config.recovery.inProcess()) return;
  const uint64_t r = round.round;
  detail::RecoveryWatch::Handlers handlers;
  handlers.connect = [store = workerStore.get()] { return store->connect(); };
  handlers.began = [this, r](const Generation& g) { onLoop([this, r, g] { onGenerationBegan(r, g); }); };
  handlers.decided = [this, r](uint64_t g, const std::string& value) {
    onLoop([this, r, g, value] { onRecoveryOutcome(r, g, value); });
  };
  handlers.failed = [this, r](const std::string& what) {
    onLoop([this, r, what] {
      if (r == round.round) console.say("drun: warning: lost the workers' store: {}\n", what);
    });
  };
  // A node that took a place in generation g (round.generation) knows the worlds before g; g
  // itself is reported (its outcome is the one it waits for).
  const uint64_t known = round.generation > 0 ? round.generation - 1 : 0;
  recoveryWatch = std::make_shared<detail::RecoveryWatch>(workerStore->prefix(r), std::move(handlers),
                                                          std::chrono::milliseconds(1000), known);
}

// The watch's threads end at once (their connections interrupted) and are joined off the loop.
void ElasticAgent::Impl::stopRecoveryWatch() {
  recoveryTimer.cancel();
  if (!recoveryWatch) return;
  recoveryWatch->stop();
  offLoop->post([watch = std::move(recoveryWatch)] {});
  recoveryWatch.reset();
}

rdzv::LivenessStore& ElasticAgent::Impl::recoveryStore() {
  if (!recoveryConnection) recoveryConnection = workerStore->connect();
  return *recoveryConnection;
}

// ---- standby workers --------------------------------------------------------------------------

// After the round's workers started: the pool of standbys, when the job keeps any.
void ElasticAgent::Impl::startStandbys() {
  standbys.reset();
  const int count = config.recovery.standbys(runsPython(config));
  if (count <= 0 || standbyExits >= kStandbyExitsBeforeOff) return;
  if (argvNamesLocalRank(config)) {
    spdlog::debug("agent: no standby workers: the program's arguments name ${{local_rank}}");
    return;
  }
  detail::StandbyPool::Options options;
  options.count = count;
  options.dir = attemptDir;
  standbys = std::make_unique<detail::StandbyPool>(*group, options, buildStandbySpec(config, round, attemptContext));
  group->onStandbyExit([this](int slot, const WorkerExit& exit) { onStandbyExit(slot, exit); });
  fillStandbys();
}

void ElasticAgent::Impl::fillStandbys() {
  if (!standbys) return;
  for (const auto& s : standbys->fill())
    note("standby_started", {{"round", round.round}, {"slot", s.slot}, {"pid", s.pid}});
}

// A standby ended before it was assigned: a program that did not wait in `import drun`, or one
// that failed before it got there. Replaced, unless it is the job's kStandbyExitsBeforeOff-th.
void ElasticAgent::Impl::onStandbyExit(int slot, const WorkerExit& exit) {
  if (!standbys) return;
  standbys->exited(slot);
  if (exit.afterStop || standbys->stopped()) return;
  spdlog::debug("agent: standby {} (pid {}) ended before it was assigned: {}", slot, exit.pid,
                statusText(exit.exitCode, exit.signal));
  if (++standbyExits >= kStandbyExitsBeforeOff) {
    console.say("drun: note: {} standby workers ended before they were assigned a rank (does the program "
                "import drun?); the job keeps none from now on\n", standbyExits);
    standbys->stop();
    return;
  }
  fillStandbys();
}

void ElasticAgent::Impl::stopStandbys() {
  if (standbys) standbys->stop();
}

// ---- actions ----------------------------------------------------------------------------------

void ElasticAgent::Impl::openRecovery(const Input& in) {
  WorkerExit exit = *in.exit;
  exit.globalRank = round.rankOffset + exit.localRank;  // its rank now: a shrink renumbers ranks
  LostWorker lost;
  lost.rank = exit.globalRank;
  lost.localRank = exit.localRank;
  lost.node = config.hostname;
  lost.exitCode = exit.exitCode;
  lost.signal = exit.signal;
  lost.pid = exit.pid;
  lost.timeMs = wallMs(exit.when);
  const uint64_t r = round.round;
  const std::string prefix = workerStore->prefix(r);
  ++opensInFlight;
  offLoopCall(
      [this, lost, prefix] {
        std::optional<int> count = rendezvous->spendRecovery();
        if (!count) return OpenResult{};
        try {
          return OpenResult{detail::openGeneration(recoveryStore(), prefix, lost, *count, config.recovery.timeout),
                            *count};
        } catch (...) {
          recoveryConnection.reset();  // a broken connection is made again on the next use
          try {
            rendezvous->refundRecovery();
          } catch (const std::exception& e) {
            spdlog::debug("agent: taking the recovery off the budget again: {}", e.what());
          }
          throw;
        }
      },
      [this, r, exit](const OpenResult& result) {
        if (r != round.round) return;
        --opensInFlight;
        Input next;
        next.exit = exit;
        if (!result.generation) {
          next.reason = "the job's restart budget (--max-restarts " +
                        std::to_string(config.rendezvous.maxRestarts) + ") is spent";
          dispatch(Event::RecoveryRefused, next);
          return;
        }
        next.generation = result.generation;
        next.restartCount = result.restartCount;
        next.reason = "generation " + std::to_string(result.generation);
        dispatch(Event::RecoveryOpened, next);
      },
      [this, r, exit](std::exception_ptr error) {
        if (r != round.round) return;
        --opensInFlight;
        Input next;
        next.exit = exit;
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          next.reason = std::string("could not open a recovery: ") + e.what();
        }
        dispatch(Event::RecoveryRefused, next);
      });
}

void ElasticAgent::Impl::startReplacement(const Input& in) {
  const WorkerExit& exit = *in.exit;
  const uint64_t g = in.generation;
  opened = Opened{g, exit.globalRank, 0};
  jobRestarts = std::max(jobRestarts, in.restartCount);
  AttemptContext context = attemptContext;
  context.restartCount = in.restartCount;
  context.generation = g;
  hangMonitor->replacing(exit.localRank);
  bool fromStandby = false;
  std::string failedToStart;
  try {
    const WorkerSpec spec = buildWorkerSpec(config, round, context, exit.localRank);
    std::optional<pid_t> standby;
    if (standbys) standby = standbys->assign(spec);
    fromStandby = standby.has_value();
    opened->replacement = standby ? *standby : group->add(spec);
    if (fromStandby) onLoop([this] { fillStandbys(); });  // after the recovery's start
  } catch (const std::exception& e) {
    failedToStart = e.what();
  }
  console.say("drun: rank {} (local_rank {}) on {} failed ({}); replacing it in place: generation {} "
              "(restart {} of {}){}\n",
              exit.globalRank, exit.localRank, config.hostname, statusText(exit.exitCode, exit.signal), g,
              in.restartCount, config.rendezvous.maxRestarts,
              fromStandby ? "; a standby took rank " + std::to_string(exit.globalRank) : "");
  if (!failedToStart.empty()) {
    Input failed;
    failed.generation = g;
    failed.reason = "the replacement of rank " + std::to_string(exit.globalRank) + " did not start: " + failedToStart;
    fallBack(failed);
    return;
  }
  hangMonitor->replaced(exit.localRank, opened->replacement);
  note("worker_started", {{"round", round.round}, {"rank", exit.globalRank}, {"local_rank", exit.localRank},
                          {"pid", opened->replacement}, {"generation", g}, {"standby", fromStandby}});
  // recovery_timeout counts from the death.
  const auto since = std::chrono::system_clock::now() - exit.when;
  armRecoveryDue(g, std::max(std::chrono::milliseconds(0),
                             config.recovery.timeout - std::chrono::duration_cast<std::chrono::milliseconds>(since)));
}

// RecoveryDue for generation g after `after`, unless g formed, was superseded or is not this
// node's to decide by then.
void ElasticAgent::Impl::armRecoveryDue(uint64_t g, std::chrono::milliseconds after) {
  recoveryTimer.expires_after(after);
  recoveryTimer.async_wait([this, g](const boost::system::error_code& ec) {
    if (ec || !opened || opened->generation != g || generation > g) return;
    Input due;
    due.generation = g;
    onLoop([this, due] { dispatch(Event::RecoveryDue, due); });
  });
}

void ElasticAgent::Impl::refuseRecovery(const Input& in) {
  console.say("drun: rank {} on {} failed ({}); no in-process recovery: {}\n", in.exit->globalRank,
              config.hostname, statusText(in.exit->exitCode, in.exit->signal), in.reason);
  stopGroup(SIGTERM);
}

// Every node: a generation began (here or elsewhere).
void ElasticAgent::Impl::noteGeneration(const Input& in) {
  const Generation& began = generations[in.generation];
  jobRestarts = std::max(jobRestarts, in.restartCount);
  if (opened && opened->generation < in.generation) {
    // The newest generation's opener decides its fallback; this node's older one is superseded.
    recoveryTimer.cancel();
    opened.reset();
  }
  nlohmann::json lost = nlohmann::json::array();
  bool here = false;
  for (const LostWorker& l : began.lost) {
    lost.push_back(nlohmann::json::parse(detail::encodeLost(l)));
    here = here || (l.rank >= round.rankOffset && l.rank < round.rankOffset + config.nprocPerNode);
  }
  note("recovery_started", {{"round", round.round}, {"generation", in.generation}, {"lost", lost},
                            {"restart_count", in.restartCount}});
  // A node that took a place in generation g has g's world already (its take said it).
  if (began.world && in.generation > round.generation)
    return began.world->grows() ? applyGrow(in) : applyShrink(in);  // agent_grow.cpp, agent_shrink.cpp
  if (began.world) return;
  if (here) return;  // startReplacement says it
  if (detail::openedHere(began, config.hostname)) return;  // a lost node's: offerLostPlaces says it
  std::string what;
  for (const LostWorker& l : began.lost)
    what += (what.empty() ? "" : "; ") + ("rank " + std::to_string(l.rank) + " on " + l.node + " failed (" +
                                          statusText(l.exitCode, l.signal) + ")");
  console.say("drun: {}; the job recovers in place: generation {} (restart {} of {})\n",
              what.empty() ? "a rank failed" : what, in.generation, in.restartCount,
              config.rendezvous.maxRestarts);
}

void ElasticAgent::Impl::recoveryFormed(const Input& in) {
  const Generation& formed = generations[in.generation];
  int64_t died = wallMs(std::chrono::system_clock::now());
  for (const LostWorker& l : formed.lost) died = std::min(died, l.timeMs);
  const int64_t ms = std::max<int64_t>(0, wallMs(std::chrono::system_clock::now()) - died);
  note("recovery_formed", {{"round", round.round}, {"generation", in.generation},
                           {"lost_ranks", rankList(formed.lost)}, {"ms", ms}});
  if (formed.world && formed.world->grows())
    console.say("drun: generation {} formed: the job runs with {} ranks on {} nodes; the workers go on\n",
                in.generation, round.worldSize, round.nodeCount);
  else
    console.say("drun: generation {} formed {} ms after rank(s) {} failed; the workers go on\n", in.generation, ms,
                rankList(formed.lost));
  // The grow this node claimed is decided once its generation or a newer one (a death while it
  // formed supersedes it, and forms with the grown world) formed: the next grow can be claimed.
  if (offered && offered->grow && offered->generation <= in.generation) {
    endGrowth(offered->places.front());
    offered.reset();
  }
  recoveryTimer.cancel();
  opened.reset();
  lossOpen = false;
  rootCause.reset();  // recovered: not a cause of anything any more
  otherFailures = 0;
  if (group && group->running() == 0) onLoop([this] { dispatch(Event::WorkersSucceeded); });
  else if (growDeferred) onLoop([this] { dispatch(nodeWaitingEvent(), Input{}); });  // agent_grow.cpp
}

// recovery_timeout passed, or the replacement ended first: the fallback is recorded (the first
// outcome written wins; the watch reports whichever it is).
void ElasticAgent::Impl::fallBack(const Input& in) {
  // Superseded: a newer generation's opener decides. (Not begun here yet is fine: the watch
  // reports g, then its outcome.)
  if (!opened || opened->generation != in.generation || in.generation < generation) return;
  if (offered && offered->generation == in.generation && !offered->withdrawn) return fallBackLostNode(in);
  const uint64_t r = round.round, g = in.generation;
  const std::string prefix = workerStore->prefix(r);
  // Who g waits for, in g's numbering (a shrink or a grow renumbered the ranks).
  const auto began = generations.find(g);
  const int world = began != generations.end() && began->second.world ? began->second.world->size() : round.worldSize;
  const std::vector<int> newcomers = detail::newcomerRanks(generations, g);
  offLoop->post([this, r, g, prefix, world, newcomers, reason = in.reason] {
    try {
      const std::string why = reason.empty() ? detail::fallbackReason(recoveryStore(), prefix, g, world, newcomers)
                                             : reason;
      detail::decideFallback(recoveryStore(), prefix, g, why);
    } catch (const std::exception& e) {
      recoveryConnection.reset();
      const std::string what = std::string("could not record the fallback: ") + e.what();
      onLoop([this, r, g, what] {
        if (r != round.round || g < generation) return;
        Input failed;
        failed.generation = g;
        failed.reason = what;
        dispatch(rootCause ? Event::RecoveryFellBack : Event::PeerRecoveryFellBack, failed);
      });
    }
  });
}

// The job restarts as under --recovery restart: the node whose generation fell back reports its
// failure (the generation's unit of the budget pays for that restart), the others re-form.
void ElasticAgent::Impl::stopAfterFallback(const Input& in) {
  console.say("drun: generation {} did not form: {}; restarting the job\n", in.generation, in.reason);
  note("recovery_fallback", {{"round", round.round}, {"generation", in.generation}, {"reason", in.reason}});
  fellBack = in.generation;
  if (state == AgentState::StoppingForFailure) {
    offLoop->post([this] {
      try {
        rendezvous->refundRecovery();  // queued before the failure report
      } catch (const std::exception& e) {
        spdlog::debug("agent: taking the recovery off the budget again: {}", e.what());
      }
    });
  }
  stopGroup(SIGTERM);
}

}  // namespace drun::agent

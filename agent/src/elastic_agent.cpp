#include "drun/agent/elastic_agent.hpp"

#include <sched.h>
#include <signal.h>

#include <boost/asio/post.hpp>
#include <algorithm>
#include <spdlog/spdlog.h>

#include "drun/agent/failure_summary.hpp"
#include "elastic_agent_impl.hpp"
#include "log_file_writer.hpp"
#include "orphan_sweep.hpp"
#include "process_spawn.hpp"

extern char** environ;

namespace drun::agent {

namespace {

using detail::Event;
using detail::Input;
using rdzv::JobEvent;

int countCpus() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

// --numa-binding: each local rank's CPUs and memory nodes, from the topology (said at info level).
std::vector<RankBinding> planBindings(const AgentConfig& config) {
  NumaPlan plan = planNumaBinding(config.numaBinding, config.nprocPerNode);
  if (config.numaBinding != NumaMode::Off && !plan.thisSystem)
    throw Error("--numa-binding: the topology of " + plan.source + " is not this machine's, so its CPUs cannot "
                "be bound here (HWLOC_THISSYSTEM=1 says it is)");
  for (size_t rank = 0; rank < plan.ranks.size(); ++rank) {
    RankBinding& r = plan.ranks[rank];
    if (!plan.bindsMemory) r.memNodes.clear();
    spdlog::info("numa binding {} on {}: local rank {}: CPUs {}, memory {}", toString(config.numaBinding),
                 plan.source, rank, describeList(r.cpus),
                 r.memNodes.empty() ? std::string("not bound") : "on node(s) " + describeList(r.memNodes));
  }
  return std::move(plan.ranks);
}

std::vector<std::string> currentEnvironment() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) out.emplace_back(*e);
  return out;
}

constexpr AgentState R = AgentState::Rendezvous, Run = AgentState::Running,
                   SF = AgentState::StoppingForFailure, Rep = AgentState::Reporting,
                   SR = AgentState::StoppingForReform, SX = AgentState::StoppingToExit,
                   Fin = AgentState::Finishing, OK = AgentState::Succeeded,
                   Bad = AgentState::Failed, Rec = AgentState::Recovering,
                   Rc = AgentState::Reconnecting, SN = AgentState::StoppingForRound;

}  // namespace

// The state machine, whole: (state, event) -> (next state, action). An event with no rule in the
// current state is ignored (logged at debug).
constexpr ElasticAgent::Impl::Rule ElasticAgent::Impl::kRules[] = {
    {AgentState::Init, Event::Start, R, &Impl::joinRound},
    {R, Event::RoundFormed, Run, &Impl::startWorkers},
    {R, Event::RendezvousFailed, Bad, &Impl::exitRendezvousFailed},
    {R, Event::JobEnded, Bad, &Impl::exitJobEnded},
    {R, Event::JobEndedOk, OK, &Impl::exitJobEnded},
    {R, Event::Signal, Bad, &Impl::exitSignalledWhileJoining},
    {Run, Event::WorkerFailed, SF, &Impl::stopWorkers},
    {Run, Event::WorkersSucceeded, Fin, &Impl::reportFinished},
    {Run, Event::JobFailed, SR, &Impl::stopForRemoteFailure},
    {Run, Event::JobFailedFinal, SX, &Impl::stopForRemoteFailure},
    {Run, Event::MemberLost, SR, &Impl::stopToReform},
    {Run, Event::StoreLost, SR, &Impl::stopToReform},
    {Run, Event::NodeWaiting, Run, &Impl::armScaleUp},
    {Run, Event::ScaleUpDue, Run, &Impl::claimScaleUp},
    {Run, Event::ScaleUpClaimed, SR, &Impl::stopToReform},
    {Run, Event::ScaleUpRefused, Run, &Impl::keepRunning},
    {Run, Event::Signal, SX, &Impl::stopForSignal},
    {Run, Event::WorkersSignalled, SX, &Impl::stopCancelled},
    {SF, Event::WorkersStopped, Rep, &Impl::reportFailure},
    {SF, Event::Signal, SX, &Impl::stopForSignal},
    {Rep, Event::VerdictRestart, R, &Impl::restartAfterFailure},
    {Rep, Event::VerdictFinal, Bad, &Impl::exitFailed},
    {Rep, Event::Signal, Bad, &Impl::exitSignalled},
    {SR, Event::WorkersStopped, R, &Impl::joinRound},
    {SR, Event::JobFailedFinal, SX, &Impl::noteFinalCause},
    {SR, Event::Signal, SX, &Impl::stopForSignal},
    {SX, Event::WorkersStopped, Bad, &Impl::exitFailed},
    {SX, Event::Signal, SX, &Impl::killNow},
    {Fin, Event::JobSucceeded, OK, &Impl::exitSucceeded},
    {Fin, Event::JobFailed, R, &Impl::rejoinAfterRemoteFailure},
    {Fin, Event::JobFailedFinal, Bad, &Impl::exitFailed},
    {Fin, Event::MemberLost, R, &Impl::rejoinToReform},
    {Fin, Event::StoreLost, R, &Impl::rejoinToReform},
    {Fin, Event::ScaleUpClaimed, R, &Impl::rejoinToReform},
    {Fin, Event::Signal, Bad, &Impl::exitSignalled},
    // --recovery in-process (docs/recovery.md; actions in agent_recovery.cpp)
    {Run, Event::WorkerToReplace, Rec, &Impl::openRecovery},
    {Run, Event::GenerationBegan, Rec, &Impl::noteGeneration},
    {Rec, Event::WorkerToReplace, Rec, &Impl::openRecovery},
    {Rec, Event::RecoveryOpened, Rec, &Impl::startReplacement},
    {Rec, Event::RecoveryRefused, SF, &Impl::refuseRecovery},
    {Rec, Event::GenerationBegan, Rec, &Impl::noteGeneration},
    {Rec, Event::RecoveryFormed, Run, &Impl::recoveryFormed},
    {Rec, Event::RecoveryDue, Rec, &Impl::fallBack},
    {Rec, Event::ReplacementFailed, Rec, &Impl::fallBack},
    {Rec, Event::RecoveryFellBack, SF, &Impl::stopAfterFallback},
    {Rec, Event::PeerRecoveryFellBack, SR, &Impl::stopAfterFallback},
    {Rec, Event::WorkersSucceeded, Fin, &Impl::reportFinished},
    {Rec, Event::JobFailed, SR, &Impl::stopForRemoteFailure},
    {Rec, Event::JobFailedFinal, SX, &Impl::stopForRemoteFailure},
    {Rec, Event::MemberLost, SR, &Impl::stopToReform},
    {Rec, Event::StoreLost, SR, &Impl::stopToReform},
    {Rec, Event::Signal, SX, &Impl::stopForSignal},
    // a lost node replaced in place (docs/recovery.md "A lost node"; agent_node_recovery.cpp)
    {Run, Event::NodeLost, Rec, &Impl::claimLostNode},
    {Rec, Event::NodeLost, Rec, &Impl::claimLostNode},  // its generation (another's claim) came first
    {Rec, Event::NodeRecoveryOpened, Rec, &Impl::offerLostPlaces},
    {Run, Event::LossUnrecovered, SR, &Impl::stopToReform},
    {Rec, Event::LossUnrecovered, SR, &Impl::stopToReform},
    // this node's workers succeeded while a lost node's place was open: its fallback re-forms
    {Fin, Event::RecoveryDue, Fin, &Impl::fallBack},
    {Fin, Event::PeerRecoveryFellBack, R, &Impl::rejoinToReform},
    {Fin, Event::LossUnrecovered, R, &Impl::rejoinToReform},
    // the place was offered after this node began stopping (a second loss, a failure, a signal)
    {SR, Event::NodeRecoveryOpened, SR, &Impl::withdrawLostPlaces},
    {SF, Event::NodeRecoveryOpened, SF, &Impl::withdrawLostPlaces},
    {SX, Event::NodeRecoveryOpened, SX, &Impl::withdrawLostPlaces},
    {R, Event::NodeRecoveryOpened, R, &Impl::withdrawLostPlaces},
    // the store lost while the workers run, under --recovery restart (agent_store_loss.cpp)
    {Run, Event::StoreLostKeepingWorkers, Rc, &Impl::reconnectKeepingWorkers},
    {Rc, Event::StoreRefilled, Rc, &Impl::rejoinKeepingWorkers},
    {Rc, Event::StoreKeptJob, SR, &Impl::fenceWorkers},
    {Rc, Event::FenceDue, SR, &Impl::fenceWorkers},
    {SR, Event::RendezvousFailed, SX, &Impl::sayRendezvousFailed},  // the reconnect, after a fence
    {Rc, Event::RoundFormed, Rc, &Impl::compareRound},
    {Rc, Event::RoundContinues, Run, &Impl::keepWorkers},
    {Rc, Event::RoundChanged, SN, &Impl::stopForNewRound},
    {Rc, Event::WorkerFailed, Rc, &Impl::holdWhileReconnecting},
    {Rc, Event::WorkersSucceeded, Rc, &Impl::holdWhileReconnecting},
    {Rc, Event::RendezvousFailed, SX, &Impl::stopStoreGone},
    {Rc, Event::JobEnded, SX, &Impl::stopStoreGone},
    {Rc, Event::JobEndedOk, SX, &Impl::stopStoreGone},
    {Rc, Event::Signal, SX, &Impl::stopForSignal},
    {Rc, Event::WorkersSignalled, SX, &Impl::stopCancelled},
    {SN, Event::WorkersStopped, Run, &Impl::startNewRound},
    {SN, Event::MemberLost, SR, nullptr},  // the new round re-forms: join again once stopped
    {SN, Event::StoreLost, SR, nullptr},
    {SN, Event::JobFailed, SR, nullptr},
    {SN, Event::JobFailedFinal, SX, &Impl::noteFinalCause},
    {SN, Event::Signal, SX, &Impl::stopForSignal},
    // a grow in place (docs/recovery.md "Elastic in place"; agent_grow.cpp): one at a time, and
    // none while a recovery is open (noted, and claimed once it formed)
    {Run, Event::GrowWanted, Run, &Impl::claimGrowth},
    {Rec, Event::GrowWanted, Rec, &Impl::deferGrowth},
    {Run, Event::GrowthOpened, Run, &Impl::offerGrowth},
    {Rec, Event::GrowthOpened, Rec, &Impl::offerGrowth},
    {Fin, Event::GrowthOpened, Fin, &Impl::offerGrowth},
    {SR, Event::GrowthOpened, SR, &Impl::withdrawGrowth},
    {SF, Event::GrowthOpened, SF, &Impl::withdrawGrowth},
    {SX, Event::GrowthOpened, SX, &Impl::withdrawGrowth},
    {R, Event::GrowthOpened, R, &Impl::withdrawGrowth},
};

// ---- the machine ----------------------------------------------------------------------------
void ElasticAgent::Impl::dispatch(Event event, const Input& input) {
  static_assert(!detail::hasDuplicateRule(kRules), "two rules for one (state, event) in kRules");
  const Rule* rule = nullptr;
  for (const Rule& r : kRules)
    if (r.from == state && r.event == event) rule = &r;
  if (!rule) {
    spdlog::debug("agent: {} ignored in {}{}", toString(event), toString(state),
                  input.reason.empty() ? "" : " (" + input.reason + ")");
    return;
  }
  transition(rule->to, std::string(toString(event)) +
                           (input.reason.empty() ? "" : ": " + input.reason));
  if (!rule->action) return;
  try {
    (this->*rule->action)(input);
  } catch (const std::exception& e) {
    internalError(e.what());
  }
}

void ElasticAgent::Impl::transition(AgentState to, const std::string& reason) {
  auto now = Clock::now();
  auto ms = std::chrono::duration_cast<std::chrono::microseconds>(now - stateSince).count() / 1000.0;
  spdlog::debug("agent: {} -> {} ({}) after {:.3f} ms in {}", toString(state), toString(to),
                reason, ms, toString(state));
  state = to;
  stateSince = now;
}

// The exception boundary: whatever an action throws ends the job cleanly, never terminate().
void ElasticAgent::Impl::internalError(const std::string& what) {
  console.say("drun: error: {}\n", what);
  if (state == AgentState::Succeeded || state == AgentState::Failed) {
    exitCode = exitCode ? exitCode : 1;
    io.stop();
    return;
  }
  transition(AgentState::Failed, std::string(toString(Event::InternalError)) + ": " + what);
  exitCode = 1;
  if (hangMonitor) hangMonitor->stop();
  stopStandbys();
  if (group && group->running() > 0)
    group->stop(SIGKILL, std::chrono::milliseconds(0), [this] { leaveAndStop(false); });
  else
    leaveAndStop(false);
}

void ElasticAgent::Impl::onLoop(std::function<void()> f) {
  boost::asio::post(io, [this, f = std::move(f)] {
    try {
      f();
    } catch (const std::exception& e) {
      internalError(e.what());
    } catch (...) {  // no exception may leave an Asio handler, a non-std one neither
      internalError("an unknown exception");
    }
  });
}

// ---- inputs -------------------------------------------------------------------------------
void ElasticAgent::Impl::onWorkerExit(const WorkerExit& reported) {
  hangMonitor->exited(reported.localRank, reported.succeeded());
  WorkerExit exit = reported;
  if (const detail::HangReport* hang = hangMonitor->report(exit.localRank); hang && !exit.succeeded()) {
    // Killed for its hang: it failed when the hang was found, not when drun ended it.
    exit.when = hang->detected;
    exit.afterStop = false;
  }
  spdlog::debug("agent: rank {} (pid {}) ended: status {}", exit.globalRank, exit.pid,
                exit.statusCode());
  notes->workerExited(exit, round.round, hangMonitor->report(exit.localRank));
  if (!exit.succeeded()) {
    // The root cause is the earliest failure that happened before drun began stopping the
    // group: failures caused by our own SIGTERM are consequences, not causes.
    const bool beforeStop = !exit.afterStop;
    if (!rootCause || (beforeStop && exit.when < rootCause->when)) {
      if (rootCause) ++otherFailures;
      rootCause = exit;
    } else {
      ++otherFailures;
    }
    if (holdForCancel(exit)) return;  // maybe a cancel: decided when its window closes
    Input in;
    in.exit = exit;
    in.reason = "rank " + std::to_string(exit.globalRank);
    dispatch(recoveryEventFor(exit, in), in);
    return;
  }
  if (cancelWindow) {
    holdForCancel(exit);  // a success in the window: not a cancel of every worker
    return;
  }
  if (group->running() == 0 && !rootCause) dispatch(Event::WorkersSucceeded);
}

void ElasticAgent::Impl::onJobEvent(const JobEvent& e) {
  // In Init and Rendezvous, `round` is the last round run (or none): news may be of the one
  // being formed.
  const bool forming = state == AgentState::Init || state == AgentState::Rendezvous;
  if (forming || e.round > round.round) {
    latched.push_back(e);  // maybe of the round being formed: replayed once it has started
    return;
  }
  if (e.round < round.round) return;  // an earlier round's news
  notes->jobEvent(e);
  Input in;
  in.reason = e.reason;
  in.failure = e.failure;
  switch (e.kind) {
    case JobEvent::Kind::Failed:
      dispatch(e.failure && e.failure->final ? Event::JobFailedFinal : Event::JobFailed, in);
      break;
    case JobEvent::Kind::Succeeded: dispatch(Event::JobSucceeded, in); break;
    case JobEvent::Kind::MemberLost: {
      const Event lost = memberLostEvent(in);
      dispatch(lost, in);
      break;
    }
    case JobEvent::Kind::NodeWaiting: dispatch(nodeWaitingEvent(), in); break;
    case JobEvent::Kind::StoreLost:
      dispatch(keepsWorkersThroughStoreLoss() ? Event::StoreLostKeepingWorkers : Event::StoreLost, in);
      break;
  }
}

void ElasticAgent::Impl::waitForSignal() {
  signals.async_wait([this](const boost::system::error_code& ec, int signal) {
    if (ec) return;
    spdlog::debug("agent: received {}", signalName(signal));
    Input in;
    in.signal = signal;
    in.reason = signalName(signal);
    try {
      dispatch(Event::Signal, in);
    } catch (const std::exception& e) {
      internalError(e.what());
    }
    waitForSignal();
  });
}

void ElasticAgent::Impl::startHealthCheck() {
  health.emplace(io, *config.healthCheckPort, [this] {
    detail::HealthStatus s;
    s.state = toString(state);
    s.round = round.round;
    s.worldSize = round.worldSize;
    s.restartsUsed = round.restartCount;
    s.maxRestarts = config.rendezvous.maxRestarts;
    s.workersRunning = group ? static_cast<int>(group->running()) : 0;
    s.runId = config.rendezvous.runId;
    s.hostname = config.hostname;
    return s;
  });
  // Port 0 takes a free one: said, since nobody else knows it.
  if (*config.healthCheckPort == 0)
    console.say("drun: health check: GET http://{}:{}/healthz\n", config.hostname, health->port());
  else
    spdlog::info("health check: GET http://{}:{}/healthz", config.hostname, health->port());
}

int ElasticAgent::Impl::run() {
  detail::raiseOpenFileLimit();
  guard.emplace(JobGuard::start());
  jobDir.emplace(config);
  numaBindings = planBindings(config);
  if (config.healthCheckPort) startHealthCheck();
  if (!jobDir->temporary()) {
    const bool filters = !config.output.duplicateStdoutFilters.empty() || !config.output.duplicateStderrFilters.empty();
    console.say("drun: log files go to {}{}\n", jobDir->path().string(),
                config.logDir ? ""
                : filters     ? " (--redirects/--tee/--duplicate-*-filters without --log-dir)"
                              : " (--redirects/--tee without --log-dir)");
  }
  for (int s : detail::catchable(handledSignals())) signals.add(s);
  waitForSignal();
  jobControl.emplace(io, [this](int sig) {
    if (group) group->signalAll(sig);
  });
  if (!config.rendezvous.runId.empty())
    spdlog::debug("agent: run id {}, job dir {}", config.rendezvous.runId, jobDir->path().string());
  rendezvous->onJobEvent([this](const JobEvent& e) { onLoop([this, e] { onJobEvent(e); }); });
  rendezvous->onWaitingForRunningJob([this] { onLoop([this] { startSpareStandbys(); }); });
  // The note matters where OpenMP does (Python: torch, numpy); elsewhere only when asked (-v).
  if (!baseHasVariable("OMP_NUM_THREADS") && config.nprocPerNode > 1 &&
      (config.isPython || spdlog::should_log(spdlog::level::info)))
    console.say("drun: note: OMP_NUM_THREADS is not set; each worker gets {} ({} cores / {} "
                "workers); set it to override\n",
                defaultOmpThreads(cpuCount, config.nprocPerNode), cpuCount, config.nprocPerNode);
  offLoop.emplace();
  hangMonitor.emplace(io, config.hangs, learnedTimeouts);
  hangMonitor->onLearned([this](const detail::LearnedNote& n) { sayLearned(n); });
  if (config.hangs.detects()) spdlog::debug("agent: hang detection: {}", describe(config.hangs));
  notes.emplace(config, *rendezvous, console.writer());
  dispatch(Event::Start);
  io.run();
  if (health) health->stop();
  stopRecoveryWatch();
  notes->flush();
  notes->detachStore();
  hangMonitor.reset();
  standbys.reset();
  group.reset();  // SIGKILLs and reaps whatever is left; the guard's destructor sweeps the rest
  // Daemons of the workers that left their groups and cleared their environment are drun's
  // children now (the subreaper): the guard's marker cannot find them.
  detail::killReparentedDescendants(guard->watchdogPid(), std::chrono::milliseconds(2000));
  console.writer()->drain(std::chrono::milliseconds(1000));  // a stopped reader cannot keep drun alive
  detail::LogFileWriter::standard()->drain(std::chrono::milliseconds(2000));  // nor a stalled disk
  jobDir.reset();  // a temporary one is removed
  // A rendezvous call still blocked in the network with a long deadline (interrupted while
  // joining) is not waited for: nothing of the job runs any more.
  if (!offLoop->stop(offLoop->busy() ? std::chrono::milliseconds(0) : OwnedThread::kDefaultJoinBound)) {
    // The call goes on, with this state (the rendezvous, the loop it posts to): it is kept until
    // the process ends (~ElasticAgent). The job guard, which would otherwise go with it, ends now.
    leftRunning = true;
    guard.reset();
    return exitCode;
  }
  rendezvous->onJobEvent(nullptr);
  rendezvous->onWaitingForRunningJob(nullptr);
  offLoop.reset();
  return exitCode;
}

std::vector<int> ElasticAgent::Impl::handledSignals() const {
  std::vector<int> out = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  for (int s : config.signalsToHandle)
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  return out;
}

bool ElasticAgent::Impl::baseHasVariable(const std::string& name) const {
  for (const auto& e : baseEnvironment)
    if (e.size() > name.size() && e.compare(0, name.size(), name) == 0 && e[name.size()] == '=')
      return true;
  return false;
}

ElasticAgent::Impl::Impl() : baseEnvironment(currentEnvironment()), cpuCount(countCpus()) {}

ElasticAgent::ElasticAgent(AgentConfig config, std::unique_ptr<rdzv::Rendezvous> rendezvous)
    : impl_(std::make_unique<Impl>()) {
  impl_->config = std::move(config);
  impl_->rendezvous = std::move(rendezvous);
}

ElasticAgent::~ElasticAgent() {
  // A rendezvous call left running on the OffLoop thread uses the state: it stays until the
  // process ends, which ends the call too; held by a static, so that a leak checker at exit does
  // not count it.
  [[maybe_unused]] static Impl* volatile leftForTheCall = nullptr;  // volatile: the store stays
  if (impl_ && impl_->leftRunning) leftForTheCall = impl_.release();
}

int ElasticAgent::run() { return impl_->run(); }

}  // namespace drun::agent

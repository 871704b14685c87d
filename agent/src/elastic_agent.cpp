#include "drun/agent/elastic_agent.hpp"

#include <sched.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <spdlog/spdlog.h>

#include "drun/agent/console_writer.hpp"
#include "drun/agent/failure_summary.hpp"
#include "drun/agent/job_guard.hpp"
#include "drun/agent/worker_env.hpp"
#include "drun/agent/worker_group.hpp"
#include "drun/common/env.hpp"
#include "drun/common/error.hpp"
#include "event_fields.hpp"
#include "event_log.hpp"
#include "job_control.hpp"
#include "log_file_writer.hpp"
#include "hang_monitor.hpp"
#include "off_loop.hpp"
#include "orphan_sweep.hpp"
#include "process_spawn.hpp"
#include "temp_dirs.hpp"

extern char** environ;

namespace drun::agent {

const char* toString(AgentState state) {
  switch (state) {
    case AgentState::Init: return "Init";
    case AgentState::Rendezvous: return "Rendezvous";
    case AgentState::Running: return "Running";
    case AgentState::StoppingForFailure: return "StoppingForFailure";
    case AgentState::Reporting: return "Reporting";
    case AgentState::StoppingForReform: return "StoppingForReform";
    case AgentState::StoppingToExit: return "StoppingToExit";
    case AgentState::Finishing: return "Finishing";
    case AgentState::Succeeded: return "Succeeded";
    case AgentState::Failed: return "Failed";
  }
  return "?";
}

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using rdzv::FailureRecord;
using rdzv::JobEvent;

enum class Event {
  Start,
  RoundFormed,       // the rendezvous returned this node's place in a round
  RendezvousFailed,  // joining failed (timeout, too few nodes, the store is gone)
  JobEnded,          // the job failed while this node waited to join (a spare)
  JobEndedOk,        // the job succeeded while this node waited to join
  WorkerFailed,      // a local worker exited non-zero or by a signal
  WorkersSucceeded,  // every local worker exited 0
  WorkersStopped,    // the group finished stopping
  VerdictRestart,    // our failure report: the job restarts
  VerdictFinal,      // our failure report: the budget is spent
  JobFailed,         // a failure anywhere (the watcher), restartable
  JobFailedFinal,    // a failure anywhere, budget spent
  JobSucceeded,      // every node's workers succeeded
  MemberLost,
  NodeWaiting,
  ScaleUpDue,        // the last call after a node began waiting
  ScaleUpClaimed,    // this round re-forms to take the waiting nodes in (this node's claim or
                     // another member's, found by finish())
  ScaleUpRefused,    // a member finished the round first: the job runs to its end
  StoreLost,
  Signal,
  InternalError,     // an exception escaped an action
};

const char* toString(Event e) {
  switch (e) {
    case Event::Start: return "start";
    case Event::RoundFormed: return "round formed";
    case Event::RendezvousFailed: return "rendezvous failed";
    case Event::JobEnded: return "job ended";
    case Event::JobEndedOk: return "job ended, succeeded";
    case Event::WorkerFailed: return "worker failed";
    case Event::WorkersSucceeded: return "workers succeeded";
    case Event::WorkersStopped: return "workers stopped";
    case Event::VerdictRestart: return "verdict: restart";
    case Event::VerdictFinal: return "verdict: final";
    case Event::JobFailed: return "job failed";
    case Event::JobFailedFinal: return "job failed, final";
    case Event::JobSucceeded: return "job succeeded";
    case Event::MemberLost: return "member lost";
    case Event::NodeWaiting: return "node waiting";
    case Event::ScaleUpDue: return "scale-up due";
    case Event::ScaleUpClaimed: return "scale-up claimed";
    case Event::ScaleUpRefused: return "scale-up refused";
    case Event::StoreLost: return "store lost";
    case Event::Signal: return "signal";
    case Event::InternalError: return "internal error";
  }
  return "?";
}

// What an event carries.
struct Input {
  std::string reason;
  std::optional<WorkerExit> exit;
  std::optional<rdzv::RoundResult> round;
  std::optional<FailureRecord> failure;
  int signal = 0;
  int code = 0;
};

int countCpus() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

std::vector<std::string> currentEnvironment() {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) out.emplace_back(*e);
  return out;
}

bool routesToFiles(const OutputOptions& output) {
  if (output.defaultRouting.redirect || output.defaultRouting.tee) return true;
  for (const auto& [rank, routing] : output.routing)
    if (routing.redirect || routing.tee) return true;
  return false;
}

// Where this run's files go (README, "Files"). Each attempt writes
// <job dir>/node<group rank>/attempt_<n>/<local rank>/{stdout,stderr}.log and error.json:
//   --log-dir DIR          DIR/<run id>, or DIR/none_<random> without --rdzv-id (torchrun's
//                          mkdtemp does the same): one run never reads or overwrites another's
//                          files; node<group rank> keeps nodes that share a file system apart.
//   -r/-t, no --log-dir    a new $TMPDIR/drun_<run id>_<random>, kept and named on stderr (the
//                          output would otherwise be thrown away; torchrun does the same).
//   neither                a temporary directory for the error files, removed at exit.
struct JobDir {
  fs::path path;
  bool temporary = true;  // removed at exit: summaries do not name files in it
};

fs::path makeUniqueDir(const fs::path& parent, const std::string& stem) {
  fs::create_directories(parent);
  std::string pattern = (parent / (stem + "_XXXXXX")).string();
  if (!::mkdtemp(pattern.data())) throw Error("cannot create a directory " + pattern + ": " + std::strerror(errno));
  return pattern;
}

JobDir makeJobDir(const AgentConfig& config) {
  const std::string& runId = config.rendezvous.runId;
  if (config.logDir) {
    if (runId == "none") return {makeUniqueDir(*config.logDir, "none"), false};
    fs::create_directories(*config.logDir / runId);
    return {*config.logDir / runId, false};
  }
  if (routesToFiles(config.output)) return {makeUniqueDir(fs::temp_directory_path(), "drun_" + runId), false};
  return {makeUniqueDir(fs::temp_directory_path(), "drun"), true};
}

}  // namespace

struct ElasticAgent::Impl {
  using Action = void (Impl::*)(const Input&);
  struct Rule {
    AgentState from;
    Event event;
    AgentState to;
    Action action;  // runs after the transition; may be null
  };

  // The state machine, whole (defined below the struct).
  static const Rule kRules[];
  static const size_t kRuleCount;

  AgentConfig config;
  std::unique_ptr<rdzv::Rendezvous> rendezvous;
  boost::asio::io_context io;
  boost::asio::signal_set signals{io};
  boost::asio::steady_timer scaleUpTimer{io};
  boost::asio::steady_timer barrierTimer{io};  // progress lines while waiting in the exit barrier
  std::optional<JobGuard> guard;
  std::unique_ptr<WorkerGroup> group;
  std::optional<OffLoop> offLoop;

  AgentState state = AgentState::Init;
  Clock::time_point stateSince = Clock::now();
  int attempt = 0;  // rounds started, names attempt_<n> directories
  rdzv::RoundResult round;
  std::vector<JobEvent> latched;      // events of a round this node has not started yet
  JobDir jobDir;
  int tempDirLock = -1;  // held on a temporary job dir while it is ours (temp_dirs.hpp)
  fs::path attemptDir;
  std::vector<std::string> baseEnvironment = currentEnvironment();
  int cpuCount = countCpus();
  // Hangs: the learned timeouts outlive the rounds (a restart does not forget them).
  detail::LearnedTimeouts learnedTimeouts;
  std::optional<detail::HangMonitor> hangMonitor;
  // The job's events (README "Watching a job"): --events and the store's history.
  std::optional<detail::EventLog> events;
  std::vector<std::string> previousHosts;  // of the last round this node ran
  bool memberLostSinceRound = false;       // a member was lost since this node's last round
  fs::path pythonPackageDir = findPythonPackageDir();

  std::optional<WorkerExit> rootCause;  // this node's first failure of the attempt
  int otherFailures = 0;
  std::optional<FailureRecord> finalCause;  // the job's root cause once its budget is spent
  int signalled = 0;                        // the signal that ends drun
  Clock::time_point signalledAt;            // when it came (a repeat within kRepeatWindow is one)
  std::optional<detail::JobControl> jobControl;  // Ctrl-Z: stops the workers with drun
  int exitCode = 0;

  // The agent's own lines go through the console writer, like the workers': they never block
  // the loop on a stopped reader, and they stay in order with the workers' lines.
  std::shared_ptr<ConsoleWriter> console = ConsoleWriter::standard();
  template <typename... Args>
  void say(const char* format, Args... args) {
    const int n = std::snprintf(nullptr, 0, format, args...);
    std::string text(static_cast<size_t>(std::max(n, 0)), '\0');
    std::snprintf(text.data(), text.size() + 1, format, args...);
    console->write(ConsoleStream::Err, std::move(text));
  }

  bool consoleGone() const {
    return console->broken(ConsoleStream::Out) || console->broken(ConsoleStream::Err);
  }

  // ---- events (README "Watching a job"; fields: event_fields.hpp) --------------------------
  static constexpr std::chrono::milliseconds kEventFlushDeadline{2000};

  void note(std::string_view kind, nlohmann::json fields = nlohmann::json::object()) {
    if (events) events->emit(kind, std::move(fields));
  }

  void setUpEvents() {
    // The node as the others know it: --local-addr tells agents of one host apart.
    const std::string& addr = config.rendezvous.localAddr;
    events.emplace(config.rendezvous.runId,
                   addr.empty() || addr == config.hostname ? config.hostname
                                                           : config.hostname + "(" + addr + ")");
    if (!config.eventsPath.empty()) events->add(detail::makeFileEventSink(config.eventsPath, console));
    if (config.jobHistory) {
      // The sink's thread may outlive run() (a store call past the flush deadline): it reaches
      // the rendezvous only through `sideStore`, which run() empties before it returns.
      sideStore = std::make_shared<SideStoreSource>();
      sideStore->rendezvous = rendezvous.get();
      events->add(detail::makeStoreEventSink(
          [source = sideStore]() -> std::unique_ptr<rdzv::LivenessStore> {
            std::lock_guard lock(source->mutex);
            return source->rendezvous ? source->rendezvous->connectSideStore() : nullptr;
          },
          config.rendezvous.runId));
    }
  }

  struct SideStoreSource {
    std::mutex mutex;
    rdzv::Rendezvous* rendezvous = nullptr;
  };
  std::shared_ptr<SideStoreSource> sideStore;

  void noteRoundStarted(const std::vector<pid_t>& pids) {
    note("round_formed", detail::roundFormedFields(round, config.nprocPerNode, config.rendezvous.maxRestarts));
    for (size_t i = 0; i < pids.size(); ++i)
      note("worker_started", {{"round", round.round}, {"rank", round.rankOffset + static_cast<int>(i)},
                              {"local_rank", i}, {"pid", pids[i]}});
    if (attempt == 1 && round.round > 0) note("spare_taken_in", {{"round", round.round}});
    if (memberLostSinceRound && round.nodeRank == 0 && !previousHosts.empty()) {
      auto added = detail::namesNotIn(round.hosts, previousHosts);
      if (!added.empty())
        note("replacement", {{"round", round.round}, {"new", added},
                             {"lost", detail::namesNotIn(previousHosts, round.hosts)}});
    }
    previousHosts = round.hosts;
    memberLostSinceRound = false;
  }

  void noteWorkerExit(const WorkerExit& exit) {
    note("worker_exited", detail::workerExitFields(exit, round.round));
    if (const detail::HangReport* hang = hangMonitor->report(exit.localRank); hang && !exit.succeeded())
      note("hang_detected", detail::hangFields(*hang, exit.globalRank, round.round));
  }

  // Only the node whose record became the round's root cause writes it (and the restart).
  void noteVerdict(const FailureRecord& mine, const FailureRecord& verdict) {
    if (verdict.rank != mine.rank || verdict.pid != mine.pid || verdict.timeMs != mine.timeMs) return;
    note("failure_recorded", {{"round", round.round}, {"failure", detail::failureJson(verdict)}});
    if (!verdict.final)
      note("restart", {{"round", round.round}, {"count", round.restartCount + 1},
                       {"max_restarts", config.rendezvous.maxRestarts},
                       {"budget_left", config.rendezvous.maxRestarts - round.restartCount - 1}});
  }

  void noteJobEvent(const JobEvent& e) {
    if (e.kind == JobEvent::Kind::MemberLost) {
      memberLostSinceRound = true;
      note("node_lost", {{"round", e.round}, {"reason", e.reason}});
    }
    if (e.kind == JobEvent::Kind::NodeWaiting) note("node_waiting", {{"round", e.round}, {"reason", e.reason}});
    if (e.kind == JobEvent::Kind::StoreLost) note("store_lost", {{"round", e.round}, {"reason", e.reason}});
  }

  // ---- the machine -------------------------------------------------------------------------
  void dispatch(Event event, const Input& input = {}) {
    const Rule* rule = nullptr;
    for (size_t i = 0; i < kRuleCount; ++i)
      if (kRules[i].from == state && kRules[i].event == event) rule = &kRules[i];
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

  void transition(AgentState to, const std::string& reason) {
    auto now = Clock::now();
    auto ms = std::chrono::duration_cast<std::chrono::microseconds>(now - stateSince).count() / 1000.0;
    spdlog::debug("agent: {} -> {} ({}) after {:.3f} ms in {}", toString(state), toString(to),
                  reason, ms, toString(state));
    state = to;
    stateSince = now;
  }

  // The exception boundary: whatever an action throws ends the job cleanly, never terminate().
  void internalError(const std::string& what) {
    say("drun: error: %s\n", what.c_str());
    if (state == AgentState::Succeeded || state == AgentState::Failed) {
      exitCode = exitCode ? exitCode : 1;
      io.stop();
      return;
    }
    // In Rendezvous the join is the call in flight (RoundFormed's action runs in Running).
    const bool joinInFlight = state == AgentState::Rendezvous;
    transition(AgentState::Failed, std::string(toString(Event::InternalError)) + ": " + what);
    exitCode = 1;
    if (hangMonitor) hangMonitor->stop();
    if (group && group->running() > 0)
      group->stop(SIGKILL, std::chrono::milliseconds(0),
                  [this, joinInFlight] { leaveAndStop(false, joinInFlight); });
    else
      leaveAndStop(false, joinInFlight);
  }

  // Posts a handler to the loop behind the exception boundary.
  template <typename F>
  void onLoop(F&& f) {
    boost::asio::post(io, [this, f = std::forward<F>(f)]() mutable {
      try {
        f();
      } catch (const std::exception& e) {
        internalError(e.what());
      } catch (...) {  // no exception may leave an Asio handler, a non-std one neither
        internalError("an unknown exception");
      }
    });
  }

  // Runs a blocking rendezvous call off the loop; `then` gets its result on the loop, `failed`
  // its error.
  template <typename Call, typename Then>
  void offLoopCall(Call call, Then then, std::function<void(std::exception_ptr)> failed) {
    offLoop->post([this, call = std::move(call), then = std::move(then),
                   failed = std::move(failed)]() mutable {
      try {
        auto result = call();
        onLoop([then = std::move(then), result = std::move(result)]() mutable { then(result); });
      } catch (...) {
        onLoop([failed = std::move(failed), error = std::current_exception()] { failed(error); });
      }
    });
  }

  // ---- actions -----------------------------------------------------------------------------
  void joinRound(const Input&) {
    note("node_joining", {{"round", attempt == 0 ? nlohmann::json() : nlohmann::json(round.round)}});
    shareLearnedTimeouts();
    offLoopCall([this] { return rendezvous->next(); },
                [this](const rdzv::RoundResult& r) {
                  Input in;
                  in.round = r;
                  in.reason = "round " + std::to_string(r.round);
                  dispatch(Event::RoundFormed, in);
                },
                [this](std::exception_ptr error) {
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
  void shareLearnedTimeouts() {
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

  void startWorkers(const Input& in) {
    round = *in.round;
    spdlog::debug("agent: round {} node {}/{} world {} offset {} master {}:{} restart {}",
                  round.round, round.nodeRank, round.nodeCount, round.worldSize, round.rankOffset,
                  round.masterAddr, round.masterPort, round.restartCount);
    attemptDir = jobDir.path / ("node" + std::to_string(round.nodeRank)) /
                 ("attempt_" + std::to_string(attempt));
    for (int r = 0; r < config.nprocPerNode; ++r) {
      fs::create_directories(attemptDir / std::to_string(r));
      // A run with the same --rdzv-id wrote here before: its error file must not pass for ours.
      std::error_code ignored;
      fs::remove(errorFilePath(attemptDir, r), ignored);
    }

    GroupOptions options;
    options.jobGuard = &*guard;  // registers each worker's process group until it is empty
    options.output = config.output;
    options.output.prefixTemplate =
        config.prefixTemplate.value_or(round.worldSize > 1 ? "[${rank}]:" : "");
    if (config.logDir || routesToFiles(config.output)) options.output.attemptDir = attemptDir;

    AttemptContext context;
    context.restartCount = round.restartCount;
    context.attemptDir = attemptDir;
    context.baseEnvironment = baseEnvironment;
    context.cpuCount = cpuCount;
    context.channels = hangMonitor->prepare(attemptDir, config.nprocPerNode);
    context.pythonPackageDir = pythonPackageDir;
    context.timerFile = hangMonitor->timerFile();
    std::vector<WorkerSpec> specs = buildWorkerSpecs(config, round, context);

    rootCause.reset();
    otherFailures = 0;
    scaleUpTimer.cancel();
    group.reset();
    group = std::make_unique<WorkerGroup>(io, std::move(options));
    group->onExit([this](const WorkerExit& exit) { onWorkerExit(exit); });
    ++attempt;
    try {
      group->start(specs);
    } catch (const std::exception& e) {
      throw Error(std::string("could not start the workers: ") + e.what());
    }
    hangMonitor->start(group->pids(), config.isPython,
                       [this](const detail::HangReport& r) { sayHung(r); });
    noteRoundStarted(group->pids());
    shareLearnedTimeouts();
    // Events of this round that arrived while it was forming.
    std::vector<JobEvent> pending;
    pending.swap(latched);
    for (const JobEvent& e : pending)
      if (e.round == round.round) onJobEvent(e);
  }

  void sayHung(const detail::HangReport& r) {
    say("drun: rank %d (local_rank %d) on %s hung: %s; taking its stack and stopping it\n",
        round.rankOffset + r.localRank, r.localRank, config.hostname.c_str(),
        r.verdict.describe().c_str());
  }

  void stopGroup(int signal) {
    hangMonitor->stop();
    scaleUpTimer.cancel();
    group->stop(signal, config.shutdownTimeout, [this] { dispatch(Event::WorkersStopped); });
  }

  void stopWorkers(const Input&) { stopGroup(SIGTERM); }

  void stopToReform(const Input& in) {
    say("drun: %s; stopping the workers and re-forming the job\n",
                 in.reason.c_str());
    stopGroup(SIGTERM);
  }

  void stopForRemoteFailure(const Input& in) {
    const FailureRecord& f = *in.failure;
    if (f.final) finalCause = f;
    say("drun: rank %d on %s failed (%s); stopping the workers%s\n", f.rank,
                 f.node.c_str(), describeStatus(f).c_str(),
                 f.final ? "" : " and restarting the job");
    stopGroup(SIGTERM);
  }

  void noteFinalCause(const Input& in) { finalCause = *in.failure; }

  void stopForSignal(const Input& in) {
    signalled = in.signal;
    signalledAt = Clock::now();
    const std::string name = signalName(in.signal);
    say("drun: received %s; stopping the workers (%s of grace, then SIGKILL; a second %s kills "
        "them now)\n", name.c_str(), humanDuration(config.shutdownTimeout).c_str(), name.c_str());
    stopGroup(in.signal);
  }

  // A signal while already stopping to exit. The same signal twice within kRepeatWindow is one
  // request (`timeout` signals drun and then its process group): the grace period stands.
  void killNow(const Input& in) {
    if (!signalled) return stopForSignal(in);  // stopping after a failure: the first signal
    if (Clock::now() - signalledAt < detail::kRepeatWindow) {
      spdlog::debug("agent: {} again within {} ms of the first: the grace period stands",
                    signalName(in.signal), detail::kRepeatWindow.count());
      return;
    }
    say("drun: second %s: killing the workers now\n", signalName(in.signal).c_str());
    group->stop(SIGKILL, std::chrono::milliseconds(0), [this] { dispatch(Event::WorkersStopped); });
  }

  void armScaleUp(const Input& in) {
    if (scaleUpTimer.expiry() > boost::asio::steady_timer::clock_type::now()) return;  // armed
    say("drun: %s; taking it in after the last call (%lld ms)\n",
                 in.reason.c_str(),
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
  void claimScaleUp(const Input& in) {
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
  void keepRunning(const Input& in) {
    const std::string reason = in.reason.empty() ? "a node of this job already finished" : in.reason;
    say("drun: not taking the waiting node(s) in: %s; the workers go on\n", reason.c_str());
    note("scale_up_refused", {{"round", round.round}, {"reason", reason}});
  }

  void reportFailure(const Input&) {
    const WorkerExit& cause = *rootCause;
    FailureRecord record = makeFailureRecord(
        cause, config.hostname, errorFilePath(attemptDir, cause.localRank), otherFailures,
        /*showPath=*/!jobDir.temporary);
    if (const detail::HangReport* hang = hangMonitor->report(cause.localRank))
      markHang(record, hang->verdict.describe(), hang->stackHow, hang->stackText);
    // A console that is gone (`drun ... | head`: its workers died of SIGPIPE) is not a failure to
    // retry: the job ends, as a shell pipeline does once its reader exits.
    record.final = consoleGone();
    offLoopCall([this, record] { return rendezvous->reportFailure(record); },
                [this, record](const FailureRecord& verdict) {
                  noteVerdict(record, verdict);
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
                    say("drun: error: could not report the failure: %s\n", e.what());
                  }
                  dispatch(Event::VerdictFinal, in);
                });
  }

  void restartAfterFailure(const Input& in) {
    const FailureRecord& f = *in.failure;
    say(
                 "drun: rank %d (local_rank %d) on %s failed (%s); restarting the job "
                 "(restart %d of %d)\n",
                 f.rank, f.localRank, f.node.c_str(), describeStatus(f).c_str(),
                 round.restartCount + 1, config.rendezvous.maxRestarts);
    joinRound(in);
  }

  void rejoinAfterRemoteFailure(const Input& in) {
    const FailureRecord& f = *in.failure;
    say("drun: rank %d on %s failed (%s); restarting the job\n", f.rank,
                 f.node.c_str(), describeStatus(f).c_str());
    joinRound(in);
  }

  void rejoinToReform(const Input& in) {
    say("drun: %s; re-forming the job\n", in.reason.c_str());
    joinRound(in);
  }

  // While this node waits in the exit barrier, say so at the rendezvous' progress pace.
  void sayStillFinishing(Clock::time_point since) {
    barrierTimer.expires_after(config.rendezvous.progressInterval);
    barrierTimer.async_wait([this, since](const boost::system::error_code& ec) {
      if (ec || state != AgentState::Finishing) return;
      say("drun: still waiting for the other node(s) of the job to finish (%s so far)\n",
          humanDuration(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since)).c_str());
      sayStillFinishing(since);
    });
  }

  void reportFinished(const Input&) {
    hangMonitor->stop();
    if (round.nodeCount > 1 && !rdzv::capabilities(config.rendezvous.backend).sharedStore) {
      // No store, no exit barrier: nothing to wait for (torchrun's static backend alike).
      say("drun: this node's workers succeeded; with the static rendezvous each node ends on its "
          "own (the other %d node(s) are not waited for)\n", round.nodeCount - 1);
    } else if (round.nodeCount > 1) {
      say("drun: this node's workers succeeded; waiting for the other %d node(s) of the job\n",
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

  void exitSucceeded(const Input&) {
    exitCode = 0;
    note("job_succeeded", {{"round", round.round}, {"code", 0}});
    leaveAndStop(true);
  }

  void exitFailed(const Input& in) {
    if (signalled) {
      exitCode = 128 + signalled;
      note("job_failed", {{"code", exitCode}, {"reason", "received " + signalName(signalled)}});
      leaveAndStop(false);
      return;
    }
    if (in.failure) finalCause = *in.failure;
    printFinalCause();
    note("job_failed", {{"round", round.round}, {"code", exitCode},
                        {"root_cause", finalCause ? detail::failureJson(*finalCause) : nlohmann::json()}});
    leaveAndStop(true);
  }

  void printFinalCause() {
    if (!finalCause) {
      exitCode = 1;
      return;
    }
    if (consoleGone()) {
      say("drun: the console was closed (broken pipe); the job ends without restarts (rank %d: "
          "%s)\n", finalCause->rank, describeStatus(*finalCause).c_str());
      exitCode = finalCause->statusCode();
      return;
    }
    say("%s\n", formatFailureSummary(*finalCause).c_str());
    if (config.isPython && !config.interpreter.empty())
      say("drun:   python on this node: %s\n", config.interpreter.c_str());
    if (config.rendezvous.maxRestarts > 0)
      say("drun: restart budget exhausted (%d restarts)\n", config.rendezvous.maxRestarts);
    exitCode = finalCause->statusCode();
  }

  // The join has returned (with an error): leaving is clean, so that a node hosting the store
  // keeps serving the others (bounded by close_timeout) until they have their answer too.
  void exitRendezvousFailed(const Input& in) {
    say("drun: error: rendezvous failed: %s\n", in.reason.c_str());
    exitCode = 1;
    note("job_failed", {{"code", exitCode}, {"reason", in.reason}});
    leaveAndStop(true);
  }

  // A spare or a late joiner learned the job's end: it leaves as a known node of the job (the
  // store's host, if that is this node, serves until the others left too).
  void exitJobEnded(const Input& in) {
    say("drun: %s\n", in.reason.c_str());
    exitCode = in.code;
    note(in.code == 0 ? "job_succeeded" : "job_failed", {{"code", in.code}, {"reason", in.reason}});
    leaveAndStop(true);
  }

  void exitSignalled(const Input& in) {
    signalled = in.signal;
    say("drun: received %s; leaving the job\n", signalName(in.signal).c_str());
    exitCode = 128 + in.signal;
    note("job_failed", {{"code", exitCode}, {"reason", "received " + signalName(in.signal)}});
    leaveAndStop(false);
  }

  // A signal while the join blocks (it may block up to the join timeout): not waited for.
  void exitSignalledWhileJoining(const Input& in) {
    signalled = in.signal;
    say("drun: received %s; leaving the job\n", signalName(in.signal).c_str());
    exitCode = 128 + in.signal;
    leaveAndStop(false, /*joinInFlight=*/true);
  }

  // Leaves the job off the loop (clean: it ended for everyone; else as a lost node, so the
  // others re-form), then ends the loop. The leave is queued behind the rendezvous call in
  // flight (a failure report, finish()): leave() always follows finish(), so the store's host
  // runs its exit barrier even when the job's Succeeded event overtook its own finish(). Only a
  // join in flight is not waited for: the loop ends at once, and run() leaves through _exit (the
  // closed connection's will tells the others).
  void leaveAndStop(bool clean, bool joinInFlight = false) {
    if (joinInFlight) {
      io.stop();
      return;
    }
    offLoop->post([this, clean] {
      // The job's history is written before this node leaves: the last one out removes the
      // job's keys, and an event after that would leave one behind.
      if (events) events->flush(kEventFlushDeadline);
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

  // ---- inputs ------------------------------------------------------------------------------
  void onWorkerExit(const WorkerExit& reported) {
    hangMonitor->exited(reported.localRank, reported.succeeded());
    WorkerExit exit = reported;
    if (const detail::HangReport* hang = hangMonitor->report(exit.localRank); hang && !exit.succeeded()) {
      // Killed for its hang: it failed when the hang was found, not when drun ended it.
      exit.when = hang->detected;
      exit.afterStop = false;
    }
    spdlog::debug("agent: rank {} (pid {}) ended: status {}", exit.globalRank, exit.pid,
                  exit.statusCode());
    noteWorkerExit(exit);
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
      Input in;
      in.exit = exit;
      in.reason = "rank " + std::to_string(exit.globalRank);
      dispatch(Event::WorkerFailed, in);
      return;
    }
    if (group->running() == 0 && !rootCause) dispatch(Event::WorkersSucceeded);
  }

  void onJobEvent(const JobEvent& e) {
    // In Init and Rendezvous, `round` is the last round run (or none): news may be of the one
    // being formed.
    const bool forming = state == AgentState::Init || state == AgentState::Rendezvous;
    if (forming || e.round > round.round) {
      latched.push_back(e);  // maybe of the round being formed: replayed once it has started
      return;
    }
    if (e.round < round.round) return;  // an earlier round's news
    noteJobEvent(e);
    Input in;
    in.reason = e.reason;
    in.failure = e.failure;
    switch (e.kind) {
      case JobEvent::Kind::Failed:
        dispatch(e.failure && e.failure->final ? Event::JobFailedFinal : Event::JobFailed, in);
        break;
      case JobEvent::Kind::Succeeded: dispatch(Event::JobSucceeded, in); break;
      case JobEvent::Kind::MemberLost: dispatch(Event::MemberLost, in); break;
      case JobEvent::Kind::NodeWaiting: dispatch(Event::NodeWaiting, in); break;
      case JobEvent::Kind::StoreLost: dispatch(Event::StoreLost, in); break;
    }
  }

  void waitForSignal() {
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

  int run() {
    detail::raiseOpenFileLimit();
    guard.emplace(JobGuard::start());
    jobDir = makeJobDir(config);
    if (jobDir.temporary) {
      tempDirLock = detail::lockTempDir(jobDir.path);  // ours: no later drun takes it for abandoned
      detail::removeAbandonedTempDirs(jobDir.path.parent_path());  // left by SIGKILLed druns
    }
    if (!jobDir.temporary)
      say("drun: log files go to %s%s\n", jobDir.path.c_str(),
          config.logDir ? "" : " (--redirects/--tee without --log-dir)");
    for (int s : detail::catchable(handledSignals())) signals.add(s);
    waitForSignal();
    jobControl.emplace(io, [this](int sig) {
      if (group) group->signalAll(sig);
    });
    if (!config.rendezvous.runId.empty())
      spdlog::debug("agent: run id {}, job dir {}", config.rendezvous.runId, jobDir.path.string());
    rendezvous->onJobEvent([this](const JobEvent& e) { onLoop([this, e] { onJobEvent(e); }); });
    // The note matters where OpenMP does (Python: torch, numpy); elsewhere only when asked (-v).
    if (!baseHasVariable("OMP_NUM_THREADS") && config.nprocPerNode > 1 &&
        (config.isPython || spdlog::should_log(spdlog::level::info)))
      say(
                   "drun: note: OMP_NUM_THREADS is not set; each worker gets %d (%d cores / %d "
                   "workers); set it to override\n",
                   defaultOmpThreads(cpuCount, config.nprocPerNode), cpuCount, config.nprocPerNode);
    offLoop.emplace();
    hangMonitor.emplace(io, config.hangs, learnedTimeouts);
    if (config.hangs.detects()) spdlog::debug("agent: hang detection: {}", describe(config.hangs));
    setUpEvents();
    dispatch(Event::Start);
    io.run();
    if (events) events->flush(kEventFlushDeadline);
    if (sideStore) {
      std::lock_guard lock(sideStore->mutex);
      sideStore->rendezvous = nullptr;
    }
    hangMonitor.reset();
    group.reset();  // SIGKILLs and reaps whatever is left; the guard's destructor sweeps the rest
    // Daemons of the workers that left their groups and cleared their environment are drun's
    // children now (the subreaper): the guard's marker cannot find them.
    detail::killReparentedDescendants(guard->watchdogPid(), std::chrono::milliseconds(2000));
    console->drain(std::chrono::milliseconds(1000));  // a stopped reader cannot keep drun alive
    detail::LogFileWriter::standard()->drain(std::chrono::milliseconds(2000));  // nor a stalled disk
    if (jobDir.temporary) {
      std::error_code ec;
      fs::remove_all(jobDir.path, ec);
      if (tempDirLock >= 0) ::close(tempDirLock);
    }
    if (offLoop->busy()) {
      // Interrupted while a rendezvous call blocks in the network with a long deadline.
      // Nothing of the job runs any more; leave without waiting for it.
      std::fflush(stdout);
      std::fflush(stderr);
      guard.reset();
      ::_exit(exitCode);
    }
    rendezvous->onJobEvent(nullptr);
    offLoop.reset();
    return exitCode;
  }

  // SIGINT, SIGTERM, SIGHUP, SIGQUIT and --signals-to-handle's.
  std::vector<int> handledSignals() const {
    std::vector<int> out = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    for (int s : config.signalsToHandle)
      if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
    return out;
  }

  bool baseHasVariable(const std::string& name) const {
    for (const auto& e : baseEnvironment)
      if (e.size() > name.size() && e.compare(0, name.size(), name) == 0 && e[name.size()] == '=')
        return true;
    return false;
  }
};

namespace {
constexpr AgentState R = AgentState::Rendezvous, Run = AgentState::Running,
                   SF = AgentState::StoppingForFailure, Rep = AgentState::Reporting,
                   SR = AgentState::StoppingForReform, SX = AgentState::StoppingToExit,
                   Fin = AgentState::Finishing, OK = AgentState::Succeeded,
                   Bad = AgentState::Failed;
}  // namespace

// The state machine, whole: (state, event) -> (next state, action). An event with no rule in the
// current state is ignored (logged at debug).
const ElasticAgent::Impl::Rule ElasticAgent::Impl::kRules[] = {
    {AgentState::Init, Event::Start, R, &ElasticAgent::Impl::joinRound},
    {R, Event::RoundFormed, Run, &ElasticAgent::Impl::startWorkers},
    {R, Event::RendezvousFailed, Bad, &ElasticAgent::Impl::exitRendezvousFailed},
    {R, Event::JobEnded, Bad, &ElasticAgent::Impl::exitJobEnded},
    {R, Event::JobEndedOk, OK, &ElasticAgent::Impl::exitJobEnded},
    {R, Event::Signal, Bad, &ElasticAgent::Impl::exitSignalledWhileJoining},
    {Run, Event::WorkerFailed, SF, &ElasticAgent::Impl::stopWorkers},
    {Run, Event::WorkersSucceeded, Fin, &ElasticAgent::Impl::reportFinished},
    {Run, Event::JobFailed, SR, &ElasticAgent::Impl::stopForRemoteFailure},
    {Run, Event::JobFailedFinal, SX, &ElasticAgent::Impl::stopForRemoteFailure},
    {Run, Event::MemberLost, SR, &ElasticAgent::Impl::stopToReform},
    {Run, Event::StoreLost, SR, &ElasticAgent::Impl::stopToReform},
    {Run, Event::NodeWaiting, Run, &ElasticAgent::Impl::armScaleUp},
    {Run, Event::ScaleUpDue, Run, &ElasticAgent::Impl::claimScaleUp},
    {Run, Event::ScaleUpClaimed, SR, &ElasticAgent::Impl::stopToReform},
    {Run, Event::ScaleUpRefused, Run, &ElasticAgent::Impl::keepRunning},
    {Run, Event::Signal, SX, &ElasticAgent::Impl::stopForSignal},
    {SF, Event::WorkersStopped, Rep, &ElasticAgent::Impl::reportFailure},
    {SF, Event::Signal, SX, &ElasticAgent::Impl::stopForSignal},
    {Rep, Event::VerdictRestart, R, &ElasticAgent::Impl::restartAfterFailure},
    {Rep, Event::VerdictFinal, Bad, &ElasticAgent::Impl::exitFailed},
    {Rep, Event::Signal, Bad, &ElasticAgent::Impl::exitSignalled},
    {SR, Event::WorkersStopped, R, &ElasticAgent::Impl::joinRound},
    {SR, Event::JobFailedFinal, SX, &ElasticAgent::Impl::noteFinalCause},
    {SR, Event::Signal, SX, &ElasticAgent::Impl::stopForSignal},
    {SX, Event::WorkersStopped, Bad, &ElasticAgent::Impl::exitFailed},
    {SX, Event::Signal, SX, &ElasticAgent::Impl::killNow},
    {Fin, Event::JobSucceeded, OK, &ElasticAgent::Impl::exitSucceeded},
    {Fin, Event::JobFailed, R, &ElasticAgent::Impl::rejoinAfterRemoteFailure},
    {Fin, Event::JobFailedFinal, Bad, &ElasticAgent::Impl::exitFailed},
    {Fin, Event::MemberLost, R, &ElasticAgent::Impl::rejoinToReform},
    {Fin, Event::StoreLost, R, &ElasticAgent::Impl::rejoinToReform},
    {Fin, Event::ScaleUpClaimed, R, &ElasticAgent::Impl::rejoinToReform},
    {Fin, Event::Signal, Bad, &ElasticAgent::Impl::exitSignalled},
};

const size_t ElasticAgent::Impl::kRuleCount = std::size(ElasticAgent::Impl::kRules);

ElasticAgent::ElasticAgent(AgentConfig config, std::unique_ptr<rdzv::Rendezvous> rendezvous)
    : impl_(std::make_unique<Impl>()) {
  impl_->config = std::move(config);
  impl_->rendezvous = std::move(rendezvous);
}

ElasticAgent::~ElasticAgent() = default;

int ElasticAgent::run() { return impl_->run(); }

}  // namespace drun::agent

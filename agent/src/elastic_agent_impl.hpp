// ElasticAgent::Impl: the agent's state machine and its wiring. The machine is one table,
// (state, event) -> (next state, action), in elastic_agent.cpp with the dispatch, the inputs
// (worker exits, the job's events, signals) and run(); the actions are in agent_actions.cpp.
// What the actions use lives in units of its own: the job's directory (job_dir.hpp), its event
// log (job_notes.hpp), drun's own console lines (agent_console.hpp), hangs (hang_monitor.hpp).
//
// Threading: everything on the io_context's thread; the rendezvous' blocking calls run on
// `offLoop` and come back as posted handlers.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent_console.hpp"
#include "agent_machine.hpp"
#include "drun/agent/elastic_agent.hpp"
#include "drun/agent/job_guard.hpp"
#include "drun/agent/worker_env.hpp"
#include "drun/agent/worker_group.hpp"
#include "hang_monitor.hpp"
#include "health_check.hpp"
#include "job_control.hpp"
#include "job_dir.hpp"
#include "job_notes.hpp"
#include "off_loop.hpp"
#include "recovery_watch.hpp"
#include "standby_pool.hpp"
#include "worker_store.hpp"

namespace drun::agent {

struct ElasticAgent::Impl {
  using Clock = std::chrono::steady_clock;
  using Input = detail::Input;
  using Event = detail::Event;
  using Action = void (Impl::*)(const Input&);
  using Rule = detail::Rule<Action>;  // its action runs after the transition; may be null

  // The state machine, whole (elastic_agent.cpp); dispatch() checks it has no duplicate.
  static const Rule kRules[];

  AgentConfig config;
  std::unique_ptr<rdzv::Rendezvous> rendezvous;
  boost::asio::io_context io;
  boost::asio::signal_set signals{io};
  boost::asio::steady_timer scaleUpTimer{io};
  boost::asio::steady_timer barrierTimer{io};  // progress lines while waiting in the exit barrier
  std::optional<JobGuard> guard;
  std::unique_ptr<WorkerGroup> group;
  std::optional<OffLoop> offLoop;
  detail::AgentConsole console;
  std::optional<detail::JobDir> jobDir;
  std::optional<detail::JobNotes> notes;  // the job's events: --events and the store's history
  std::optional<detail::HealthCheck> health;  // TORCHELASTIC_HEALTH_CHECK_PORT's /healthz

  AgentState state = AgentState::Init;
  Clock::time_point stateSince = Clock::now();
  int attempt = 0;  // rounds started, names attempt_<n> directories
  rdzv::RoundResult round;
  std::vector<rdzv::JobEvent> latched;  // events of a round this node has not started yet
  std::filesystem::path attemptDir;
  std::vector<std::string> baseEnvironment;
  int cpuCount = 1;
  std::vector<RankBinding> numaBindings;  // --numa-binding, by local rank: read once at the start
  // Hangs: the learned timeouts outlive the rounds (a restart does not forget them).
  detail::LearnedTimeouts learnedTimeouts;
  std::optional<detail::HangMonitor> hangMonitor;
  std::filesystem::path pythonPackageDir = findPythonPackageDir();

  std::optional<WorkerExit> rootCause;  // this node's first failure of the attempt
  int otherFailures = 0;
  std::optional<rdzv::FailureRecord> finalCause;  // the job's root cause once its budget is spent
  int signalled = 0;                              // the signal that ends drun
  Clock::time_point signalledAt;  // when it came (a repeat within kRepeatWindow is one)
  std::optional<detail::JobControl> jobControl;  // Ctrl-Z: stops the workers with drun
  // A cancel (agent_cancel.cpp): SIGTERM/SIGINT to drun, or to every local worker at once from
  // outside (scancel: slurmstepd signals the workers). `cancelledBy` says who was signalled; the
  // window holds the workers' exits while it is open, to tell a cancel from a failure.
  std::string cancelledBy;
  struct CancelWindow {
    int signal = 0;
    bool mixed = false;  // an exit in the window ended otherwise: a failure after all
    std::vector<WorkerExit> exits;
  };
  std::optional<CancelWindow> cancelWindow;
  boost::asio::steady_timer cancelTimer{io};
  int exitCode = 0;
  bool leftRunning = false;  // run() left a rendezvous call running on offLoop (see run())
  // Joins (next(), reconnectAfterLoss()) running on offLoop: an exit does not wait for them.
  int joinsInFlight = 0;
  boost::asio::steady_timer fenceTimer{io};  // Reconnecting: heartbeat_timeout, then the workers stop
  bool storeRefilled = false;                // Reconnecting: the store came back empty (no fence)
  std::optional<rdzv::RoundResult> newRound;  // StoppingForRound: the round to start once stopped

  // --recovery in-process (agent_recovery.cpp). The workers' store outlives the rounds; the
  // watch and what the round's generations are live for one round (reset by startWorkers).
  std::unique_ptr<detail::WorkerStore> workerStore;
  std::unique_ptr<rdzv::LivenessStore> recoveryConnection;  // the OffLoop thread's, made on use
  std::shared_ptr<detail::RecoveryWatch> recoveryWatch;
  boost::asio::steady_timer recoveryTimer{io};  // recovery_timeout of the generation opened here
  AttemptContext attemptContext;  // the round's workers' context: a replacement's starts from it
  uint64_t generation = 0;        // the newest generation begun in this round
  std::map<uint64_t, detail::Generation> generations;  // this round's, by number
  // The generation this node opened last, while it is the newest: its fallback is this node's.
  struct Opened {
    uint64_t generation = 0;
    int rank = 0;
    pid_t replacement = 0;  // 0 until started
  };
  std::optional<Opened> opened;
  int opensInFlight = 0;  // generations being opened off the loop (a formed outcome waits for them)
  int jobRestarts = 0;    // the job's restarts and recoveries as this node knows them
  std::optional<uint64_t> fellBack;  // the generation whose fallback restarts the job
  // Standby workers (standby_pool.hpp): the round's pool (destroyed before `group`, declared
  // earlier), and how many standbys of the job ended unassigned: at kStandbyExitsBeforeOff the
  // job keeps none any more (a program that never imports drun runs to its end in each).
  std::unique_ptr<detail::StandbyPool> standbys;
  int standbyExits = 0;
  static constexpr int kStandbyExitsBeforeOff = 2;
  // A lost node replaced in place (agent_node_recovery.cpp), reset with the round: the places
  // this node offered and their generation; the loss watched for a recovery that never began.
  struct OfferedPlaces {
    uint64_t generation = 0;
    std::vector<rdzv::Vacancy> places;
    bool withdrawn = false;  // at recovery_timeout: no spare can take them any more
    bool grow = false;       // a grow's place (agent_grow.cpp): no unit of the budget to refund
  };
  std::optional<OfferedPlaces> offered;
  bool lossOpen = false;  // a lost node's recovery began here and has not formed (Finishing waits for it)
  boost::asio::steady_timer lossTimer{io};  // recovery_timeout from a loss

  Impl();

  // ---- the machine (elastic_agent.cpp) -----------------------------------------------------
  void dispatch(Event event, const Input& input = {});
  void transition(AgentState to, const std::string& reason);
  // The exception boundary: whatever an action throws ends the job cleanly, never terminate().
  void internalError(const std::string& what);
  // Posts a handler to the loop behind the exception boundary.
  void onLoop(std::function<void()> f);
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
  void note(std::string_view kind, nlohmann::json fields = nlohmann::json::object()) {
    if (notes) notes->note(kind, std::move(fields));
  }

  // ---- inputs (elastic_agent.cpp) ----------------------------------------------------------
  void onWorkerExit(const WorkerExit& reported);
  void onJobEvent(const rdzv::JobEvent& e);
  void waitForSignal();
  std::vector<int> handledSignals() const;  // SIGINT, SIGTERM, SIGHUP, SIGQUIT, --signals-to-handle's
  bool baseHasVariable(const std::string& name) const;
  int run();
  void startHealthCheck();  // TORCHELASTIC_HEALTH_CHECK_PORT (elastic_agent.cpp)

  // ---- actions (agent_actions.cpp) ---------------------------------------------------------
  void joinRound(const Input&);
  void shareLearnedTimeouts();
  void sayLearned(const detail::LearnedNote& note);
  void forgetLearnedTimeouts(const rdzv::FailureRecord& cause);
  void startWorkers(const Input& in);
  void sayHung(const detail::HangReport& r);
  void stopGroup(int signal);
  void stopWorkers(const Input&);
  void stopToReform(const Input& in);
  void stopForRemoteFailure(const Input& in);
  void noteFinalCause(const Input& in);
  void stopForSignal(const Input& in);
  void killNow(const Input& in);
  void armScaleUp(const Input& in);
  void claimScaleUp(const Input& in);
  void keepRunning(const Input& in);
  void reportFailure(const Input&);
  void restartAfterFailure(const Input& in);
  void rejoinAfterRemoteFailure(const Input& in);
  void rejoinToReform(const Input& in);
  void sayStillFinishing(Clock::time_point since);
  void reportFinished(const Input&);
  void exitSucceeded(const Input&);
  void exitFailed(const Input& in);
  void printFinalCause();
  void exitRendezvousFailed(const Input& in);
  void exitJobEnded(const Input& in);
  void exitSignalled(const Input& in);
  void exitSignalledWhileJoining(const Input& in);
  // ---- the store lost while the workers run (agent_store_loss.cpp) ---------------------------
  bool keepsWorkersThroughStoreLoss() const;
  void keepWorkersStore(uint64_t workersRound);
  void reconnectKeepingWorkers(const Input& in);
  void rejoinKeepingWorkers(const Input& in);
  void fenceWorkers(const Input& in);
  void sayRendezvousFailed(const Input& in);
  void compareRound(const Input& in);
  void keepWorkers(const Input& in);
  void holdWhileReconnecting(const Input& in);
  void stopForNewRound(const Input& in);
  void startNewRound(const Input& in);
  void stopStoreGone(const Input& in);
  // ---- a cancel (agent_cancel.cpp) --------------------------------------------------------
  bool holdForCancel(const WorkerExit& exit);  // true: the exit waits for the window to close
  void closeCancelWindow();
  void closeCancelWindowSoon();
  void stopCancelled(const Input& in);
  void noteCancelBy(int signal);  // a signal to drun: who was signalled, when it is a cancel
  void noteSignalledEnd();        // job_cancelled or job_failed, with the console's line
  void leaveAndStop(bool clean);

  // ---- in-process recovery (agent_recovery.cpp) -------------------------------------------
  Event recoveryEventFor(const WorkerExit& exit, Input& in);  // WorkerFailed unless in-process
  void prepareRecovery(AttemptContext& context);
  void startRecoveryWatch();
  void stopRecoveryWatch();
  rdzv::LivenessStore& recoveryStore();  // OffLoop thread only
  void onGenerationBegan(uint64_t forRound, const detail::Generation& began);
  void onRecoveryOutcome(uint64_t forRound, uint64_t g, const std::string& value);
  void startStandbys();
  void onStandbyExit(int slot, const WorkerExit& exit);
  void fillStandbys();  // a standby_started event for each one started
  void stopStandbys();
  void openRecovery(const Input& in);
  void startReplacement(const Input& in);
  void armRecoveryDue(uint64_t g, std::chrono::milliseconds after);  // recoveryTimer: RecoveryDue
  void refuseRecovery(const Input& in);
  void noteGeneration(const Input& in);
  void recoveryFormed(const Input& in);
  void fallBack(const Input& in);
  void stopAfterFallback(const Input& in);

  // ---- a spare's standby workers (agent_spare.cpp) -------------------------------------------
  GroupOptions groupOptions(int worldSize, const std::filesystem::path& attemptDir);
  void startSpareStandbys();            // this node began waiting to join a running job
  void startSpareStandbysIn(const std::filesystem::path& dir);  // startSpareStandbys' work, may throw
  bool takesPlaceWithStandbys() const;  // the round is a place taken, with the spare's standbys
  struct PlaceWorkers {
    std::vector<pid_t> pids;        // by local rank
    std::vector<bool> fromStandby;  // by local rank
  };
  PlaceWorkers startPlaceWorkers(const std::vector<WorkerSpec>& specs);
  void keepSpareStandbys();

  // ---- a lost node replaced in place (agent_node_recovery.cpp) -----------------------------
  // NodeLost under in-process while running (or when the generation opened for the loss came
  // first: in.generation is set to it), else MemberLost.
  Event memberLostEvent(Input& in) const;
  void prepareNodeRecovery(AttemptContext& context);
  void claimLostNode(const Input& in);
  void offerLostPlaces(const Input& in);
  void fallBackLostNode(const Input& in);
  void withdrawLostPlaces(const Input& in);

  // ---- elastic in place (agent_shrink.cpp) -------------------------------------------------
  bool canShrinkWithout(const std::vector<rdzv::Vacancy>& places) const;  // MIN nodes remain
  void shrinkInPlace(const Input& in, const std::vector<rdzv::Vacancy>& places);
  void applyShrink(const Input& in);  // every node: a shrink generation began

  // ---- a grow in place (agent_grow.cpp) ----------------------------------------------------
  Event nodeWaitingEvent() const;  // GrowWanted under in-process below MAX, else NodeWaiting
  void claimGrowth(const Input& in);
  void deferGrowth(const Input& in);
  void offerGrowth(const Input& in);
  void withdrawGrowth(const Input& in);
  void endGrowth(const rdzv::Vacancy& place);  // off the loop: the next grow can be claimed
  void applyGrow(const Input& in);             // every node: a grow generation began
  bool growDeferred = false;  // a node waited while a recovery was open: claim once it formed
};

}  // namespace drun::agent

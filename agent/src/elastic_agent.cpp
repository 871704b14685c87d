#include "drun/agent/elastic_agent.hpp"

#include <sched.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <spdlog/spdlog.h>
#include <thread>

#include "drun/agent/failure_summary.hpp"
#include "drun/common/error.hpp"
#include "drun/agent/job_guard.hpp"
#include "drun/agent/worker_env.hpp"
#include "drun/agent/worker_group.hpp"

extern char** environ;

namespace drun::agent {

const char* toString(AgentState state) {
  switch (state) {
    case AgentState::Init: return "Init";
    case AgentState::Rendezvous: return "Rendezvous";
    case AgentState::Running: return "Running";
    case AgentState::Restarting: return "Restarting";
    case AgentState::Stopping: return "Stopping";
    case AgentState::Succeeded: return "Succeeded";
    case AgentState::Failed: return "Failed";
  }
  return "?";
}

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

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

// The job's private directory: --log-dir/<run_id> (kept), else a temporary one holding the error
// files (removed at exit).
fs::path makeJobDir(const AgentConfig& config, bool& temporary) {
  if (config.logDir) {
    temporary = false;
    fs::path dir = *config.logDir / config.rendezvous.runId;
    fs::create_directories(dir);
    return dir;
  }
  temporary = true;
  std::string base = (fs::temp_directory_path() / "drun-XXXXXX").string();
  if (!::mkdtemp(base.data())) throw Error("cannot create a temporary directory under " + base);
  return base;
}

bool routesToFiles(const OutputOptions& output) {
  if (output.defaultRouting.redirect || output.defaultRouting.tee) return true;
  for (const auto& [rank, routing] : output.routing)
    if (routing.redirect || routing.tee) return true;
  return false;
}

}  // namespace

struct ElasticAgent::Impl {
  AgentConfig config;
  std::unique_ptr<rdzv::Rendezvous> rendezvous;
  boost::asio::io_context io;
  boost::asio::signal_set signals{io};
  std::optional<JobGuard> guard;
  std::unique_ptr<WorkerGroup> group;

  AgentState state = AgentState::Init;
  Clock::time_point stateSince = Clock::now();
  int restartCount = 0;        // restarts consumed (TORCHELASTIC_RESTART_COUNT)
  int attempt = 0;             // rounds started, names attempt_<n> directories
  rdzv::RoundResult round;
  fs::path jobDir;
  bool jobDirTemporary = true;
  fs::path attemptDir;
  std::vector<std::string> baseEnvironment = currentEnvironment();
  int cpuCount = countCpus();

  std::optional<WorkerExit> rootCause;
  int otherFailures = 0;
  std::chrono::system_clock::time_point stopRequestedWall{};
  bool stopping = false;
  int receivedSignal = 0;
  int exitCode = 0;

  std::thread rendezvousThread;
  std::atomic<bool> rendezvousBusy{false};

  void transition(AgentState to, const std::string& reason) {
    auto now = Clock::now();
    auto ms = std::chrono::duration_cast<std::chrono::microseconds>(now - stateSince).count() / 1000.0;
    spdlog::debug("agent: {} -> {} ({}) after {:.3f} ms", toString(state), toString(to), reason, ms);
    state = to;
    stateSince = now;
  }

  void finish(AgentState final, int code, const std::string& reason) {
    transition(final, reason);
    exitCode = code;
    io.stop();
  }

  // --- rendezvous -------------------------------------------------------------------------
  void startRendezvous() {
    transition(AgentState::Rendezvous, "attempt " + std::to_string(attempt));
    if (rendezvousThread.joinable()) rendezvousThread.join();
    rendezvousBusy = true;
    // next() blocks (up to the join timeout) on the network: run it off the event loop so that
    // signals are still handled; the result comes back as a posted event.
    rendezvousThread = std::thread([this] {
      try {
        rdzv::RoundResult result = rendezvous->next();
        rendezvousBusy = false;
        boost::asio::post(io, [this, result] { onRound(result); });
      } catch (const std::exception& e) {
        rendezvousBusy = false;
        std::string message = e.what();
        boost::asio::post(io, [this, message] { onRendezvousFailed(message); });
      }
    });
  }

  void onRendezvousFailed(const std::string& message) {
    if (state != AgentState::Rendezvous) return;
    std::fprintf(stderr, "drun: error: rendezvous failed: %s\n", message.c_str());
    finish(AgentState::Failed, 1, "rendezvous failed");
  }

  void onRound(const rdzv::RoundResult& result) {
    if (state != AgentState::Rendezvous) return;  // a signal arrived meanwhile
    round = result;
    spdlog::debug("agent: round {} node {}/{} world {} offset {} master {}:{}", round.round,
                  round.nodeRank, round.nodeCount, round.worldSize, round.rankOffset,
                  round.masterAddr, round.masterPort);
    try {
      startWorkers();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "drun: error: could not start the workers: %s\n", e.what());
      if (group) {
        stopping = true;
        group->stop(SIGKILL, std::chrono::milliseconds(0), [this] {
          finish(AgentState::Failed, 1, "start failed");
        });
      } else {
        finish(AgentState::Failed, 1, "start failed");
      }
    }
  }

  // --- workers ----------------------------------------------------------------------------
  void startWorkers() {
    attemptDir = jobDir / ("attempt_" + std::to_string(attempt));
    for (int r = 0; r < config.nprocPerNode; ++r) fs::create_directories(attemptDir / std::to_string(r));

    GroupOptions options;
    options.jobGuard = &*guard;  // registers each worker's process group until it is empty
    options.output = config.output;
    options.output.prefixTemplate =
        config.prefixTemplate.value_or(round.worldSize > 1 ? "[${rank}]:" : "");
    if (config.logDir || routesToFiles(config.output)) options.output.attemptDir = attemptDir;

    AttemptContext context;
    context.restartCount = restartCount;
    context.attemptDir = attemptDir;
    context.baseEnvironment = baseEnvironment;
    context.cpuCount = cpuCount;
    std::vector<WorkerSpec> specs = buildWorkerSpecs(config, round, context);

    rootCause.reset();
    otherFailures = 0;
    stopping = false;
    group = std::make_unique<WorkerGroup>(io, std::move(options));
    group->onExit([this](const WorkerExit& exit) { onWorkerExit(exit); });
    group->start(specs);
    ++attempt;
    transition(AgentState::Running, std::to_string(specs.size()) + " workers, restart " +
                                        std::to_string(restartCount));
  }

  void onWorkerExit(const WorkerExit& exit) {
    spdlog::debug("agent: rank {} (pid {}) ended: status {}", exit.globalRank, exit.pid, exit.statusCode());
    if (!exit.succeeded()) {
      // The root cause is the earliest failure that happened before drun began stopping the
      // group: failures caused by our own SIGTERM are consequences, not causes.
      bool beforeStop = !stopping || exit.when < stopRequestedWall;
      if (!rootCause || (beforeStop && exit.when < rootCause->when)) {
        if (rootCause) ++otherFailures;
        rootCause = exit;
      } else {
        ++otherFailures;
      }
      if (!stopping) {  // not already stopping for a signal, a membership change or a failure
        stopGroup(SIGTERM, [this] { afterFailure(); });
        return;
      }
    }
    if (!stopping && group->running() == 0) afterSuccess();
  }

  void stopGroup(int signal, std::function<void()> then) {
    stopping = true;
    stopRequestedWall = std::chrono::system_clock::now();
    if (state == AgentState::Running) transition(AgentState::Stopping, "stopping the workers");
    group->stop(signal, config.shutdownTimeout, std::move(then));
  }

  void afterSuccess() {
    rendezvous->leave();
    finish(AgentState::Succeeded, 0, "every worker succeeded");
  }

  void afterFailure() {
    const WorkerExit& cause = *rootCause;
    if (restartCount < config.maxRestarts) {
      ++restartCount;
      std::fprintf(stderr,
                   "drun: rank %d (local_rank %d) failed with status %d; restarting the workers "
                   "(restart %d of %d)\n",
                   cause.globalRank, cause.localRank, cause.statusCode(), restartCount,
                   config.maxRestarts);
      transition(AgentState::Restarting, "worker failure, budget left");
      startRendezvous();
      return;
    }
    std::string summary = formatFailureSummary(
        cause, config.hostname, errorFilePath(attemptDir, cause.localRank), otherFailures);
    std::fprintf(stderr, "%s\n", summary.c_str());
    if (config.maxRestarts > 0)
      std::fprintf(stderr, "drun: restart budget exhausted (%d restarts)\n", config.maxRestarts);
    rendezvous->leave();
    finish(AgentState::Failed, cause.statusCode(), "worker failure, no restarts left");
  }

  // --- events from outside ----------------------------------------------------------------
  void onMembershipChange(const std::string& reason) {
    if (state != AgentState::Running || stopping) return;
    std::fprintf(stderr, "drun: membership changed (%s); re-forming the job\n", reason.c_str());
    stopGroup(SIGTERM, [this, reason] {
      transition(AgentState::Restarting, "membership change: " + reason);
      startRendezvous();
    });
  }

  void waitForSignal() {
    signals.async_wait([this](const boost::system::error_code& ec, int signal) {
      if (ec) return;
      onSignal(signal);
      waitForSignal();
    });
  }

  void onSignal(int signal) {
    spdlog::debug("agent: received {}", signalName(signal));
    if (receivedSignal != 0) {
      // A second signal: stop waiting for the grace period.
      if (group && stopping) group->stop(SIGKILL, std::chrono::milliseconds(0), [this] {
        finish(AgentState::Failed, 128 + receivedSignal, "killed after a second signal");
      });
      return;
    }
    receivedSignal = signal;
    std::fprintf(stderr, "drun: received %s; stopping the workers\n", signalName(signal).c_str());
    if (group && group->running() > 0) {
      stopGroup(signal, [this] {
        finish(AgentState::Failed, 128 + receivedSignal, "stopped by " + signalName(receivedSignal));
      });
    } else {
      finish(AgentState::Failed, 128 + signal, "stopped by " + signalName(signal));
    }
  }

  int run() {
    guard.emplace(JobGuard::start());
    jobDir = makeJobDir(config, jobDirTemporary);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) signals.add(s);
    waitForSignal();
    if (!config.rendezvous.runId.empty())
      spdlog::debug("agent: run id {}, job dir {}", config.rendezvous.runId, jobDir.string());
    rendezvous->onMembershipChange([this](const std::string& reason) {
      boost::asio::post(io, [this, reason] { onMembershipChange(reason); });
    });
    if (!baseHasVariable("OMP_NUM_THREADS") && config.nprocPerNode > 1)
      std::fprintf(stderr,
                   "drun: note: OMP_NUM_THREADS is not set; each worker gets %d (%d cores / %d "
                   "workers); set it to override\n",
                   defaultOmpThreads(cpuCount, config.nprocPerNode), cpuCount, config.nprocPerNode);
    startRendezvous();
    io.run();
    group.reset();  // SIGKILLs and reaps whatever is left; the guard's destructor sweeps the rest
    if (jobDirTemporary) {
      std::error_code ec;
      fs::remove_all(jobDir, ec);
    }
    if (rendezvousBusy) {
      // Interrupted while joining: the rendezvous thread is blocked in the network with a long
      // deadline. Nothing of the job runs any more; leave without waiting for it.
      std::fflush(stdout);
      std::fflush(stderr);
      guard.reset();
      ::_exit(exitCode);
    }
    if (rendezvousThread.joinable()) rendezvousThread.join();
    return exitCode;
  }

  bool baseHasVariable(const std::string& name) const {
    for (const auto& e : baseEnvironment)
      if (e.size() > name.size() && e.compare(0, name.size(), name) == 0 && e[name.size()] == '=')
        return true;
    return false;
  }
};

ElasticAgent::ElasticAgent(AgentConfig config, std::unique_ptr<rdzv::Rendezvous> rendezvous)
    : impl_(std::make_unique<Impl>()) {
  impl_->config = std::move(config);
  impl_->rendezvous = std::move(rendezvous);
}

ElasticAgent::~ElasticAgent() = default;

int ElasticAgent::run() { return impl_->run(); }

}  // namespace drun::agent

// A spare's standby workers (docs/recovery.md, "A lost node"): under --recovery in-process, a
// node that waits to join a job that runs without it (a spare, a newcomer: it may take a lost
// node's place) keeps one standby per local rank while it waits, in the worker group its workers
// will run in. When it takes a place, its ranks go to the standbys (processes that imported, or
// are importing, what the program imports before `import drun`) and only the others start as new
// processes; the pool then keeps the round's count, as any node's. A round that forms otherwise
// (the job re-forms, a scale-up takes the node in) starts its workers in a new group, as before:
// the spare's standbys end with the old one.
#include <spdlog/spdlog.h>

#include "elastic_agent_impl.hpp"

namespace drun::agent {

GroupOptions ElasticAgent::Impl::groupOptions(int worldSize, const std::filesystem::path& dir) {
  GroupOptions options;
  options.jobGuard = &*guard;  // registers each worker's process group until it is empty
  options.output = config.output;
  options.output.prefixTemplate = config.prefixTemplate.value_or(worldSize > 1 ? "[${rank}]:" : "");
  if (config.logDir || detail::routesToFiles(config.output)) options.output.attemptDir = dir;
  return options;
}

// The join began to wait for a running job's next round (the rendezvous' onWaitingForRunningJob).
void ElasticAgent::Impl::startSpareStandbys() {
  if (state != AgentState::Rendezvous || attempt != 0 || group || !config.recovery.inProcess()) return;
  if (config.recovery.standbys(runsPython(config)) <= 0 || argvNamesLocalRank(config)) return;
  // The log files are the place's (its node rank's directory), not known while it waits.
  if (config.logDir || detail::routesToFiles(config.output)) {
    spdlog::debug("agent: no standby workers while waiting as a spare: the output goes to log files");
    return;
  }
  try {
    startSpareStandbysIn(jobDir->path() / "spare");
  } catch (const std::exception& e) {
    // They only shorten a recovery: the spare waits on without them (new processes take a place).
    spdlog::warn("agent: no standby workers while waiting as a spare: {}", e.what());
    standbys.reset();
    group.reset();
  }
}

void ElasticAgent::Impl::startSpareStandbysIn(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  // A spare takes a place in a job of several nodes: its workers' prefixes name their ranks.
  group = std::make_unique<WorkerGroup>(io, groupOptions(2, {}));
  group->onExit([this](const WorkerExit& exit) { onWorkerExit(exit); });
  group->start({});
  // What the place's workers share is not known yet (world size, master, the workers' store):
  // the assignment carries everything that differs from this environment.
  AttemptContext context;
  context.baseEnvironment = baseEnvironment;
  context.cpuCount = cpuCount;
  context.pythonPackageDir = pythonPackageDir;
  context.timerFile = hangMonitor->timerFile();
  detail::StandbyPool::Options options;
  options.count = config.nprocPerNode;
  options.dir = dir;
  standbys = std::make_unique<detail::StandbyPool>(*group, options,
                                                   buildStandbySpec(config, rdzv::RoundResult{}, context));
  group->onStandbyExit([this](int slot, const WorkerExit& exit) { onStandbyExit(slot, exit); });
  for (const auto& s : standbys->fill())
    note("standby_started", {{"round", nullptr}, {"slot", s.slot}, {"pid", s.pid}, {"spare", true}});
}

bool ElasticAgent::Impl::takesPlaceWithStandbys() const {
  return round.generation != 0 && group && standbys && !standbys->stopped();
}

// The place's workers, in local-rank order: a standby for each rank that has one (a ready one
// first, else one still starting: it has a head start on a new process), else a new process.
// Returns their pids and which came from a standby.
ElasticAgent::Impl::PlaceWorkers ElasticAgent::Impl::startPlaceWorkers(const std::vector<WorkerSpec>& specs) {
  PlaceWorkers started;
  for (const WorkerSpec& spec : specs) {
    std::optional<pid_t> standby = standbys->assign(spec, detail::StandbyPool::Taking::Starting);
    started.fromStandby.push_back(standby.has_value());
    started.pids.push_back(standby ? *standby : group->add(spec));
  }
  return started;
}

// After the place's workers started: the pool keeps the round's count of standbys from now on.
void ElasticAgent::Impl::keepSpareStandbys() {
  standbys->keep(config.recovery.standbys(runsPython(config)));
  fillStandbys();
}

}  // namespace drun::agent

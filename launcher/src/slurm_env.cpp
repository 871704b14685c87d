// SLURM step detection and the values drun takes from it (see slurm_env.hpp for the mapping and
// docs/slurm.md for the design: port, several tasks per node, the store's host).
#include "drun/launcher/slurm_env.hpp"

#include <sstream>

#include "drun/common/env.hpp"
#include "drun/common/host_port.hpp"
#include "drun/launcher/cli.hpp"
#include "drun/launcher/hostlist.hpp"

extern char** environ;

namespace drun::launch {
namespace {

constexpr long long kMaxSlurmId = 4294967295LL;  // job and step ids are 32-bit in SLURM

// The first of `names` that is set: (name, value).
std::optional<std::pair<std::string, std::string>> first(const EnvMap& env,
                                                         std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (auto it = env.find(name); it != env.end()) return std::pair<std::string, std::string>{name, it->second};
  return std::nullopt;
}

long long number(const std::pair<std::string, std::string>& var, long long min, long long max) {
  try {
    return env::parseInt(var.second, var.first + " (from SLURM)", min, max);
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
}

// SLURM's task counts per node: "2(x3),1" -> {2, 2, 2, 1}, kept as (count, repeat) pairs.
std::vector<std::pair<long long, long long>> taskCounts(const std::pair<std::string, std::string>& var) {
  std::vector<std::pair<long long, long long>> counts;
  std::string item;
  std::istringstream in(var.second);
  while (std::getline(in, item, ',')) {
    long long repeat = 1;
    if (auto paren = item.find("(x"); paren != std::string::npos) {
      if (item.back() != ')')
        throw UsageError(var.first + "='" + var.second + "' (from SLURM): expected COUNT or COUNT(xREPEAT)");
      repeat = number({var.first, item.substr(paren + 2, item.size() - paren - 3)}, 1, kMaxSlurmId);
      item.resize(paren);
    }
    counts.emplace_back(number({var.first, item}, 0, kMaxSlurmId), repeat);
  }
  if (counts.empty()) throw UsageError(var.first + " (from SLURM) is empty");
  return counts;
}

[[noreturn]] void severalTasks(const std::string& what) {
  throw UsageError(
      what + ": drun is a per-node agent, one drun per node starts all of that node's workers, so "
             "several tasks per node would form several jobs. Write `srun --ntasks-per-node=1 drun "
             "--nproc-per-node N ...` (and --ntasks-per-node=1 on sbatch/salloc), giving the "
             "workers per node with --nproc-per-node; --no-slurm ignores SLURM altogether");
}

// Several tasks of this step on one node: the step's own variables first (authoritative: a job's
// SLURM_NTASKS_PER_NODE / SLURM_TASKS_PER_NODE are inherited by every srun inside it, whatever
// that srun asked for), the job's when the step's are absent.
void checkOneTaskPerNode(const EnvMap& env, int nodes) {
  auto perNode = first(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
  if (perNode)
    for (auto [count, repeat] : taskCounts(*perNode))
      if (count > 1) severalTasks("srun started " + std::to_string(count) + " tasks on a node (" + perNode->first + "=" + perNode->second + ")");
  if (!env.contains("SLURM_STEP_TASKS_PER_NODE"))
    if (auto ntpn = first(env, {"SLURM_NTASKS_PER_NODE"}); ntpn && number(*ntpn, 0, kMaxSlurmId) > 1)
      severalTasks("srun started " + ntpn->second + " tasks per node (SLURM_NTASKS_PER_NODE=" + ntpn->second + ")");
  if (auto tasks = first(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}))
    if (number(*tasks, 0, kMaxSlurmId) > nodes)
      severalTasks("srun started " + tasks->second + " tasks on " + std::to_string(nodes) + " nodes (" +
                   tasks->first + "=" + tasks->second + ")");
}

}  // namespace

EnvMap currentEnvironment() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view entry(*e);
    auto eq = entry.find('=');
    if (eq != std::string_view::npos) env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

namespace {
std::optional<SlurmStep> readStep(const EnvMap& env) {
  auto job = first(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  auto step = first(env, {"SLURM_STEP_ID", "SLURM_STEPID"});
  if (!job || !step) return std::nullopt;

  SlurmStep s;
  s.jobId = static_cast<uint64_t>(number(*job, 0, kMaxSlurmId));
  s.stepId = static_cast<uint64_t>(number(*step, 0, kMaxSlurmId));

  auto nodes = first(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"});
  if (!nodes) throw UsageError("SLURM step " + job->second + "." + step->second + ": SLURM_STEP_NUM_NODES is not set");
  s.nodeCount = static_cast<int>(number(*nodes, 1, 65000));
  checkOneTaskPerNode(env, s.nodeCount);

  auto nodeId = first(env, {"SLURM_NODEID"});
  if (!nodeId) throw UsageError("SLURM step " + job->second + "." + step->second + ": SLURM_NODEID is not set");
  s.nodeId = static_cast<int>(number(*nodeId, 0, s.nodeCount - 1));

  auto list = first(env, {"SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"});
  if (!list) throw UsageError("SLURM step " + job->second + "." + step->second + ": SLURM_STEP_NODELIST is not set");
  std::vector<std::string> hosts;
  try {
    hosts = expandHostlist(list->second);
  } catch (const InvalidArgument& e) {
    throw UsageError(list->first + " (from SLURM): " + e.what());
  }
  // The step's own list names exactly its nodes; a job's list (fallback) may name more.
  bool stepList = list->first == "SLURM_STEP_NODELIST";
  if (stepList ? hosts.size() != static_cast<size_t>(s.nodeCount) : hosts.size() < static_cast<size_t>(s.nodeCount))
    throw UsageError(list->first + "=" + list->second + " names " + std::to_string(hosts.size()) +
                     " nodes but " + nodes->first + "=" + nodes->second);
  s.firstHost = hosts.front();
  s.nodelistVar = list->first;
  return s;
}
}  // namespace

std::optional<SlurmStep> detectSlurmStep(const EnvMap& env) {
  try {
    return readStep(env);
  } catch (const UsageError& e) {
    std::string what = e.what();
    if (what.find("--no-slurm") == std::string::npos) what += " (--no-slurm ignores SLURM_*)";
    throw UsageError(what);
  }
}

std::optional<std::string> slurmOutsideStepWarning(const EnvMap& env) {
  auto job = first(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
  auto nodes = first(env, {"SLURM_JOB_NUM_NODES", "SLURM_NNODES"});
  if (!job || !nodes || first(env, {"SLURM_STEP_ID", "SLURM_STEPID"})) return std::nullopt;
  if (nodes->second == "1" || nodes->second == "0") return std::nullopt;
  return "SLURM job " + job->second + " has " + nodes->second + " nodes (" + nodes->first + "), but this drun "
         "is not in an srun step (started by the batch script itself?), so it uses this node only; "
         "`srun --ntasks-per-node=1 drun ...` runs one drun per node and forms one job of them all";
}

uint16_t slurmRendezvousPort(uint64_t jobId, uint64_t stepId) {
  return static_cast<uint16_t>(kSlurmPortBase + (jobId % 1000) * 8 + stepId % 8);
}

SlurmFill slurmFill(const SlurmStep& step, const std::function<bool(const std::string&)>& given) {
  SlurmFill fill;
  auto take = [&](const char* name, std::string value) {
    if (!given(name)) fill.options.emplace_back(name, std::move(value));
  };
  take("nnodes", std::to_string(step.nodeCount));
  take("node-rank", std::to_string(step.nodeId));
  if (!given("rdzv-endpoint")) {
    const HostPort endpoint{step.firstHost, slurmRendezvousPort(step.jobId, step.stepId)};
    fill.options.emplace_back("rdzv-endpoint", endpoint.toString());
    fill.isHost = step.nodeId == 0;
  }
  take("rdzv-id", std::to_string(step.jobId) + "." + std::to_string(step.stepId));
  return fill;
}

std::string SlurmFill::describe(const SlurmStep& step) const {
  std::string text = "SLURM step " + std::to_string(step.jobId) + "." + std::to_string(step.stepId) +
                     " (node " + std::to_string(step.nodeId) + " of " + std::to_string(step.nodeCount) +
                     ", " + step.nodelistVar + "): ";
  if (options.empty()) return text + "took nothing (every setting given on the command line or by PET_*)";
  text += "took";
  for (const auto& [name, value] : options) text += " --" + name + " " + value;
  if (isHost) text += *isHost ? " (this node hosts the store)" : " (the first node hosts the store)";
  return text;
}

}  // namespace drun::launch

#include "drun/agent/worker_env.hpp"

#include <algorithm>
#include <filesystem>
#include <map>

namespace drun::agent {
namespace {

std::string substituteLocalRank(std::string arg, int localRank) {
  static const std::string kMacro = "${local_rank}";
  for (size_t at = arg.find(kMacro); at != std::string::npos; at = arg.find(kMacro, at)) {
    std::string value = std::to_string(localRank);
    arg.replace(at, kMacro.size(), value);
    at += value.size();
  }
  return arg;
}

}  // namespace

std::filesystem::path findPythonPackageDir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  auto dir = (exe.parent_path() / ".." / "lib" / "drun" / "python").lexically_normal();
  return std::filesystem::is_directory(dir, ec) ? dir : std::filesystem::path();
}

int defaultOmpThreads(int cpuCount, int localWorkers) {
  return std::max(1, cpuCount / std::max(1, localWorkers));
}

std::filesystem::path errorFilePath(const std::filesystem::path& attemptDir, int localRank) {
  return attemptDir / std::to_string(localRank) / "error.json";
}

namespace {

// What every local rank of the attempt gets. Ordered map: later assignments override drun's
// inherited environment.
std::map<std::string, std::string> commonEnvironment(const AgentConfig& config,
                                                     const rdzv::RoundResult& round,
                                                     const AttemptContext& attempt) {
  std::map<std::string, std::string> common;
  for (const std::string& entry : attempt.baseEnvironment) {
    auto eq = entry.find('=');
    if (eq != std::string::npos) common[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  const int local = config.nprocPerNode;
  common["WORLD_SIZE"] = std::to_string(round.worldSize);
  common["LOCAL_WORLD_SIZE"] = std::to_string(local);
  common["GROUP_RANK"] = std::to_string(round.nodeRank);
  common["GROUP_WORLD_SIZE"] = std::to_string(round.nodeCount);
  common["ROLE_NAME"] = config.role;
  common["ROLE_WORLD_SIZE"] = std::to_string(round.worldSize);  // one role per job
  common["MASTER_ADDR"] = round.masterAddr;
  common["MASTER_PORT"] = std::to_string(round.masterPort);
  common["TORCHELASTIC_RUN_ID"] = config.rendezvous.runId;
  common["TORCHELASTIC_RESTART_COUNT"] = std::to_string(attempt.restartCount);
  common["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(config.rendezvous.maxRestarts);
  common["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  if (!common.count("OMP_NUM_THREADS"))
    common["OMP_NUM_THREADS"] = std::to_string(defaultOmpThreads(attempt.cpuCount, local));
  if (config.isPython && !common.count("PYTHONUNBUFFERED")) common["PYTHONUNBUFFERED"] = "1";
  if (!common.count("NCCL_ASYNC_ERROR_HANDLING")) common["NCCL_ASYNC_ERROR_HANDLING"] = "1";
  // The workers' comm bootstrap store proves the same secret as the rendezvous store.
  if (!config.rendezvous.tokenFile.empty())
    common["DRUN_RDZV_TOKEN_FILE"] = std::filesystem::absolute(config.rendezvous.tokenFile).string();
  // Hangs: faulthandler prints a Python worker's stack on the SIGABRT that ends a hung one.
  if (!common.count("PYTHONFAULTHANDLER")) common["PYTHONFAULTHANDLER"] = "1";
  if (!attempt.pythonPackageDir.empty()) {
    auto it = common.find("PYTHONPATH");
    const bool userPath = it != common.end() && !it->second.empty();
    common["PYTHONPATH"] = attempt.pythonPackageDir.string() + (userPath ? ":" + it->second : "");
  }
  if (!attempt.timerFile.empty() && !common.count("TORCHELASTIC_TIMER_FILE"))
    common["TORCHELASTIC_TIMER_FILE"] = attempt.timerFile.string();
  // DRUN_JOB_TOKEN is the WorkerGroup's to add: it belongs to the JobGuard the group reports to.
  // In-process recovery: the workers' store, never one inherited from an outer drun.
  for (const char* name : {"DRUN_RECOVERY", "DRUN_WORKER_STORE", "DRUN_WORKER_STORE_PREFIX", "DRUN_GENERATION"})
    common.erase(name);
  if (!attempt.workerStore.empty()) {
    common["DRUN_RECOVERY"] = toString(RecoveryMode::InProcess);
    common["DRUN_WORKER_STORE"] = attempt.workerStore;
    common["DRUN_WORKER_STORE_PREFIX"] = attempt.workerStorePrefix;
    common["DRUN_GENERATION"] = std::to_string(attempt.generation);
  }
  return common;
}

// --virtual-local-rank, as torchrun: LOCAL_RANK=0, and CUDA_VISIBLE_DEVICES the local rank's own
// entry of drun's (stripped), or the local rank's number when drun has none. The launcher refused
// a list shorter than the local ranks; a rank past it keeps drun's list.
void narrowToOwnDevice(std::map<std::string, std::string>& env, int localRank) {
  env["LOCAL_RANK"] = "0";
  auto visible = env.find("CUDA_VISIBLE_DEVICES");
  if (visible == env.end()) {
    env["CUDA_VISIBLE_DEVICES"] = std::to_string(localRank);
    return;
  }
  std::vector<std::string> devices = splitDeviceList(visible->second);
  if (static_cast<size_t>(localRank) < devices.size()) visible->second = devices[localRank];
}

WorkerSpec specFor(const AgentConfig& config, const rdzv::RoundResult& round, const AttemptContext& attempt,
                   const std::map<std::string, std::string>& common, int localRank) {
  WorkerSpec spec;
  spec.localRank = localRank;
  spec.globalRank = round.rankOffset + localRank;
  for (const std::string& arg : config.program) spec.argv.push_back(substituteLocalRank(arg, localRank));
  std::map<std::string, std::string> mine = common;
  mine["RANK"] = std::to_string(spec.globalRank);
  mine["LOCAL_RANK"] = std::to_string(localRank);
  if (config.virtualLocalRank) narrowToOwnDevice(mine, localRank);
  mine["ROLE_RANK"] = std::to_string(spec.globalRank);
  mine["TORCHELASTIC_ERROR_FILE"] = errorFilePath(attempt.attemptDir, localRank).string();
  if (static_cast<size_t>(localRank) < attempt.channels.size() && !attempt.channels[localRank].empty())
    mine["DRUN_WORKER_CHANNEL"] = attempt.channels[localRank].string();
  spec.env.reserve(mine.size());
  for (const auto& [key, value] : mine) spec.env.push_back(key + "=" + value);
  if (static_cast<size_t>(localRank) < attempt.bindings.size()) spec.binding = attempt.bindings[localRank];
  return spec;
}

}  // namespace

std::vector<WorkerSpec> buildWorkerSpecs(const AgentConfig& config, const rdzv::RoundResult& round,
                                         const AttemptContext& attempt) {
  const std::map<std::string, std::string> common = commonEnvironment(config, round, attempt);
  std::vector<WorkerSpec> specs;
  specs.reserve(config.nprocPerNode);
  for (int localRank = 0; localRank < config.nprocPerNode; ++localRank)
    specs.push_back(specFor(config, round, attempt, common, localRank));
  return specs;
}

WorkerSpec buildWorkerSpec(const AgentConfig& config, const rdzv::RoundResult& round,
                           const AttemptContext& attempt, int localRank) {
  return specFor(config, round, attempt, commonEnvironment(config, round, attempt), localRank);
}

bool runsPython(const AgentConfig& config) {
  if (config.isPython) return true;
  if (config.program.empty()) return false;
  return std::filesystem::path(config.program.front()).filename().string().rfind("python", 0) == 0;
}

bool argvNamesLocalRank(const AgentConfig& config) {
  for (const std::string& arg : config.program)
    if (substituteLocalRank(arg, 0) != arg) return true;
  return false;
}

WorkerSpec buildStandbySpec(const AgentConfig& config, const rdzv::RoundResult& round,
                            const AttemptContext& attempt) {
  std::map<std::string, std::string> common = commonEnvironment(config, round, attempt);
  for (const char* name : {"TORCHELASTIC_RESTART_COUNT", "DRUN_GENERATION", "DRUN_STANDBY"}) common.erase(name);
  WorkerSpec spec;
  spec.argv = config.program;
  for (const auto& [key, value] : common) spec.env.push_back(key + "=" + value);
  return spec;
}

}  // namespace drun::agent

// Computes what each local worker is started with: its argv (with ${local_rank} substituted) and
// its complete environment (drun's own environment plus the torchrun variables of this round).
// Pure functions of (config, round, attempt); no I/O.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "drun/agent/agent_config.hpp"
#include "drun/agent/worker_group.hpp"
#include "drun/rendezvous/rendezvous.hpp"

namespace drun::agent {

struct AttemptContext {
  int restartCount = 0;                    // TORCHELASTIC_RESTART_COUNT
  std::filesystem::path attemptDir;        // .../attempt_<n>: error files live in <local_rank>/
  std::vector<std::string> baseEnvironment;  // drun's environ, "KEY=VALUE"
  int cpuCount = 1;                        // for OMP_NUM_THREADS
  // Hangs (docs/hangs.md): each local rank's channel (DRUN_WORKER_CHANNEL), drun's Python
  // package directory (prepended to PYTHONPATH: `import drun.worker`), torch's FileTimer FIFO
  // (TORCHELASTIC_TIMER_FILE). Empty: not given.
  std::vector<std::filesystem::path> channels;
  std::filesystem::path pythonPackageDir;
  std::filesystem::path timerFile;
  // --recovery in-process (docs/recovery.md): the workers' store ("host:port"), this round's key
  // prefix in it, and the generation the worker starts in (0 at the round's start, g for a
  // replacement). Empty store: DRUN_RECOVERY and its variables are not given.
  std::string workerStore;
  std::string workerStorePrefix;
  uint64_t generation = 0;
  // --numa-binding: each local rank's binding (numa_binding.hpp); empty: none.
  std::vector<RankBinding> bindings;
};

// <dir of the drun binary>/../lib/drun/python when it exists (the build tree and an installed
// drun alike), else empty.
std::filesystem::path findPythonPackageDir();

// CUDA_VISIBLE_DEVICES' entries as Python's str.split(",") and strip() make them ("" -> {""}).
std::vector<std::string> splitDeviceList(const std::string& list);

// OMP_NUM_THREADS given when the user did not set it: cores / local workers, at least 1.
int defaultOmpThreads(int cpuCount, int localWorkers);

std::filesystem::path errorFilePath(const std::filesystem::path& attemptDir, int localRank);

std::vector<WorkerSpec> buildWorkerSpecs(const AgentConfig& config, const rdzv::RoundResult& round,
                                         const AttemptContext& attempt);
// The spec of one local rank (buildWorkerSpecs' element): an in-process recovery's replacement.
WorkerSpec buildWorkerSpec(const AgentConfig& config, const rdzv::RoundResult& round,
                           const AttemptContext& attempt, int localRank);

// Standby workers (docs/recovery.md): the spec of a process started ahead of need, before its
// rank is known: the workers' argv and the environment every local rank shares (no RANK,
// LOCAL_RANK, ROLE_RANK, TORCHELASTIC_ERROR_FILE, DRUN_WORKER_CHANNEL, DRUN_GENERATION,
// TORCHELASTIC_RESTART_COUNT); its ranks are 0. Its assignment carries the rest.
WorkerSpec buildStandbySpec(const AgentConfig& config, const rdzv::RoundResult& round,
                            const AttemptContext& attempt);
// Whether the workers run Python: drun starts the interpreter (`script.py`, -m) or the program is
// one whose name begins with "python" (`/usr/bin/python3 script.py`).
bool runsPython(const AgentConfig& config);
// Whether the program's argv names the local rank (${local_rank}): no standby can run it.
bool argvNamesLocalRank(const AgentConfig& config);

}  // namespace drun::agent

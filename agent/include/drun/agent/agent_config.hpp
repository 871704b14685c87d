// AgentConfig: everything the agent needs to run one node's share of a job, as one value.
//
// Built by the launcher from the command line and the environment (PET_*, SLURM_*); nothing else
// reads argv or getenv for these settings. Plain aggregate with defaults; passed const&.
#pragma once

#include <csignal>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "drun/agent/hang_options.hpp"
#include "drun/agent/numa_binding.hpp"
#include "drun/agent/recovery_options.hpp"
#include "drun/agent/worker_group.hpp"
#include "drun/rendezvous/rendezvous.hpp"

namespace drun::agent {

using namespace std::chrono_literals;

struct AgentConfig {
  // The program as it will be exec'd: argv[0] resolved (python3 prepended for .py / -m).
  // "${local_rank}" in any argument is substituted per worker.
  std::vector<std::string> program;
  int nprocPerNode = 1;
  std::string role = "default";
  std::chrono::milliseconds shutdownTimeout = 30s;  // SIGTERM -> SIGKILL grace
  std::string hostname;                          // this node's name, for env and summaries
  rdzv::RendezvousOptions rendezvous;            // nnodes, restart budget, endpoint, run id, ...
  bool isPython = false;                         // set PYTHONUNBUFFERED=1 unless already set
  std::string interpreter;  // Python workers: "<path> (<where the choice came from>)", for messages
  // Output.
  std::optional<std::filesystem::path> logDir;   // per-attempt, per-rank files
  OutputOptions output;                          // filter, redirects/tee (prefix set per round)
  // Console prefix template; nullopt = "[${rank}]:" when the job has more than one worker.
  std::optional<std::string> prefixTemplate;
  // Signals that end the job as SIGTERM does, each forwarded to the workers first
  // (--signals-to-handle: torchrun's list; drun always catches these four besides). One that was
  // ignored when drun started stays ignored (nohup).
  std::vector<int> signalsToHandle = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  // Hang detection (--hang-timeout, --hang-idle): off unless given; docs/hangs.md.
  HangOptions hangs;
  // A worker's failure: restart the job, or replace the worker in place (--recovery).
  RecoveryOptions recovery;
  // Events (docs/observe.md): --events / DRUN_EVENTS ("" = none, "-" = stderr), and the
  // job's history in the store (DRUN_JOB_HISTORY; only with a shared store).
  std::string eventsPath;
  bool jobHistory = true;
  // Where the workers run (torchrun 2.9-2.11's flags; docs/options.md, "Placement"):
  // --numa-binding binds each local rank's CPUs and memory (numa_binding.hpp); --virtual-local-rank
  // gives every worker LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES narrowed to its own device.
  NumaMode numaBinding = NumaMode::Off;
  bool virtualLocalRank = false;
  // TORCHELASTIC_HEALTH_CHECK_PORT: the agent answers GET /healthz on this port while it runs
  // (0: a free port, said on stderr); nullopt: no health check server.
  std::optional<uint16_t> healthCheckPort;
};

}  // namespace drun::agent

// SLURM detection: under an srun step (SLURM_JOB_ID and SLURM_STEP_ID set) drun takes what the
// user did not give from the step, so that `srun -N2 --ntasks-per-node=1 drun --nproc-per-node 4
// prog` forms ONE job of 8 workers, not two jobs of 4:
//
//   --nnodes         SLURM_STEP_NUM_NODES (else SLURM_NNODES, SLURM_JOB_NUM_NODES)
//   --node-rank      SLURM_NODEID
//   --rdzv-endpoint  first host of SLURM_STEP_NODELIST (else SLURM_NODELIST, SLURM_JOB_NODELIST)
//                    : slurmRendezvousPort(job, step)
//   --rdzv-id        <SLURM_JOB_ID>.<SLURM_STEP_ID>
//   is_host          SLURM_NODEID == 0 (the first node hosts the embedded store), unless the
//                    endpoint or is_host was given
//
// Precedence: command line > PET_* > SLURM; `--no-slurm` (and `--standalone`) turn it off. The
// launcher is the only reader of SLURM_*: it passes a snapshot of the environment in, so every
// function here is pure (no getenv, no I/O) and thread-safe.
//
// srun starting several tasks on one node is a mistake for a per-node agent (each would form its
// own job or collide with the others): detectSlurmStep throws UsageError telling the user to
// write `--ntasks-per-node=1` and `--nproc-per-node N`, and drun exits 2 in every task.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace drun::launch {

using EnvMap = std::map<std::string, std::string>;

// The current process environment as a map (the launcher's one snapshot).
EnvMap currentEnvironment();

// What one srun step says about this node.
struct SlurmStep {
  uint64_t jobId = 0;
  uint64_t stepId = 0;
  int nodeCount = 1;      // nodes of the step
  int nodeId = 0;         // this node's index in the step, 0-based
  std::string firstHost;  // the step's first node: hosts the rendezvous store
  std::string nodelistVar;  // which variable the host list came from (for the log)
};

// nullopt when this is not an srun step (no SLURM_JOB_ID or no SLURM_STEP_ID/SLURM_STEPID).
// Throws UsageError on several tasks per node or malformed SLURM_* values (naming the variable).
std::optional<SlurmStep> detectSlurmStep(const EnvMap& env);

// A warning when drun runs inside a SLURM job of several nodes but not in an srun step (drun
// started by the batch script itself): it forms a job on this node only. nullopt otherwise.
std::optional<std::string> slurmOutsideStepWarning(const EnvMap& env);

// The rendezvous port every node of a step computes alike, without talking:
//   kSlurmPortBase + (job % 1000) * 8 + (step % 8)     -> 20000..27999
// Below Linux's ephemeral range (32768-60999), so no outgoing connection holds it; distinct for
// any two jobs whose ids differ by less than 1000 and any two steps of a job whose ids differ by
// less than 8 (srun's concurrent steps are numbered 0, 1, 2, ...).
inline constexpr uint16_t kSlurmPortBase = 20000;
uint16_t slurmRendezvousPort(uint64_t jobId, uint64_t stepId);

// The command-line values drun takes from the step, by option name ("nnodes", "node-rank",
// "rdzv-endpoint", "rdzv-id"), each only when given(name) is false (neither on the command line
// nor by PET_*), and the is_host choice that goes with an endpoint taken from SLURM.
struct SlurmFill {
  std::vector<std::pair<std::string, std::string>> options;  // (name, value), in a fixed order
  std::optional<bool> isHost;  // set when the endpoint came from SLURM
  std::string describe(const SlurmStep& step) const;  // for the info log
};
SlurmFill slurmFill(const SlurmStep& step, const std::function<bool(const std::string&)>& given);

}  // namespace drun::launch

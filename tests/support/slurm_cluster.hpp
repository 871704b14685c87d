// The real SLURM cluster the [slurm] tests run on: scripts/slurm/up.sh, brought up once by the
// CTest fixture `slurm_cluster` (scripts/slurm/ctest_fixture.sh) and torn down after the last of
// them. Where it cannot run (not root, no network namespaces, SLURM not installed, another
// cluster on the machine) the fixture records why and every [slurm] test skips (77) saying so.
//
// Threading: one test thread. Nothing here starts or stops the cluster.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace drun::test {

struct SlurmCluster {
  std::filesystem::path dir;   // $DRUN_SLURM_DIR, else <build>/slurm-cluster (the fixture's)
  std::string conf;            // its slurm.conf
  std::string confEnv() const { return "SLURM_CONF=" + conf; }  // for RunOptions::env
  std::filesystem::path jobsDir() const { return dir / "jobs"; }  // world-writable, every node sees it
};

// The running cluster, or skipTest(reason): never returns without one.
SlurmCluster requireSlurmCluster();

// Absolute path of a SLURM client program (srun, sbatch, squeue, scancel), looked up in /usr/bin
// and /usr/local/bin.
std::string slurmTool(const std::string& name);

}  // namespace drun::test

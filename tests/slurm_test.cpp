// drun under a real SLURM cluster (scripts/slurm/up.sh: 2 nodes, each its own network namespace,
// hostname and IP; brought up by the CTest fixture slurm_cluster). Each test is one srun or sbatch
// as a user writes it; every run carries a unique marker variable (srun passes the caller's
// environment on to its tasks), so whatever of the job is still alive afterwards is found by PID.
#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "drun/common/test_skip.hpp"
#include "process.hpp"
#include "slurm_cluster.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

constexpr int kNodes = 2;
constexpr int kNprocPerNode = 2;

// `srun -N2 --ntasks-per-node=<tasksPerNode> drun --nproc-per-node 2 <program...>`.
RunOptions srunDrun(const SlurmCluster& cluster, const MarkerScope& marker, int tasksPerNode,
                    std::vector<std::string> program, std::chrono::milliseconds timeout = 60s) {
  RunOptions o;
  o.argv = {slurmTool("srun"), "-N" + std::to_string(kNodes),
            "--ntasks-per-node=" + std::to_string(tasksPerNode), "--time=2", drunPath().string(),
            "--nproc-per-node", std::to_string(kNprocPerNode)};
  o.argv.insert(o.argv.end(), program.begin(), program.end());
  o.env = {cluster.confEnv(), marker.env()};
  o.cwd = cluster.jobsDir();
  o.timeout = timeout;
  return o;
}

// `srun -N2 --ntasks-per-node=1 bash scripts/slurm/run.sh <program>` (the seed's run.sh, done
// with drun), 2 workers per node.
RunOptions srunRunSh(const SlurmCluster& cluster, const MarkerScope& marker, const std::string& program) {
  RunOptions o;
  o.argv = {slurmTool("srun"), "-N" + std::to_string(kNodes), "--ntasks-per-node=1", "--time=2", "/bin/bash",
            std::string(DRUN_SOURCE_DIR) + "/scripts/slurm/run.sh", program};
  o.env = {cluster.confEnv(), marker.env(), "DRUN=" + drunPath().string(),
           "NPROC_PER_NODE=" + std::to_string(kNprocPerNode)};
  o.cwd = cluster.jobsDir();
  o.timeout = 60s;
  return o;
}

// The env_dump output of one job of 2 nodes x 2 workers: ranks 0..3 exactly once, one world of
// 4, node rank 0 on the first node, one run id <job>.<step> everywhere. Returns the run id.
std::string checkOneJobOfFour(const std::string& output) {
  auto dumps = parseEnvDumps(output);
  dumps.erase(-1);  // lines without a rank prefix (none expected, but not ours to judge)
  std::set<int> ranks;
  for (const auto& [rank, dump] : dumps) ranks.insert(rank);
  REQUIRE(ranks == std::set<int>{0, 1, 2, 3});
  std::set<std::string> runIds, nodesOfGroup0, nodesOfGroup1;
  for (const auto& [rank, dump] : dumps) {
    INFO("rank " << rank);
    CHECK(dump.count("RANK") == 1);  // two jobs would print rank 0 twice
    CHECK(dump.get("RANK") == std::to_string(rank));
    CHECK(dump.get("LOCAL_RANK") == std::to_string(rank % kNprocPerNode));
    CHECK(dump.get("WORLD_SIZE") == "4");
    CHECK(dump.get("GROUP_RANK") == std::to_string(rank / kNprocPerNode));
    CHECK(dump.get("GROUP_WORLD_SIZE") == "2");
    CHECK(dump.get("LOCAL_WORLD_SIZE") == "2");
    CHECK(dump.get("MASTER_ADDR") == "n1");  // the step's first node
    runIds.insert(dump.get("TORCHELASTIC_RUN_ID").value_or("?"));
    // GROUP_RANK follows SLURM_NODEID: node rank 0 is where SLURM put task 0.
    CHECK(dump.get("SLURM_NODEID") == dump.get("GROUP_RANK"));
    (rank / kNprocPerNode == 0 ? nodesOfGroup0 : nodesOfGroup1).insert(dump.get("SLURMD_NODENAME").value_or("?"));
  }
  CHECK(nodesOfGroup0 == std::set<std::string>{"n1"});
  CHECK(nodesOfGroup1 == std::set<std::string>{"n2"});
  REQUIRE(runIds.size() == 1);
  CHECK(std::regex_match(*runIds.begin(), std::regex("[0-9]+\\.[0-9]+")));
  return *runIds.begin();
}

void checkNothingLeft(const MarkerScope& marker, std::chrono::milliseconds timeout = 10s) {
  auto left = marker.leftovers(timeout);
  INFO("left behind:\n" << MarkerScope::describe(left));
  CHECK(left.empty());
}

std::string readAll(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("slurm: srun -N2 --ntasks-per-node=1 drun forms one job of 4 workers", "[slurm]") {
  SlurmCluster cluster = requireSlurmCluster();
  MarkerScope marker;
  RunResult r = run(srunDrun(cluster, marker, 1, {helperPath("env_dump").string()}));
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  std::string runId = checkOneJobOfFour(r.out);
  // The run id is the step's: <SLURM_JOB_ID>.<SLURM_STEP_ID>.
  auto dumps = parseEnvDumps(r.out);
  CHECK(runId == *dumps.at(0).get("SLURM_JOB_ID") + "." + *dumps.at(0).get("SLURM_STEP_ID"));
  checkNothingLeft(marker);
}

TEST_CASE("slurm: the seed's run.sh done with drun forms one job under srun", "[slurm]") {
  SlurmCluster cluster = requireSlurmCluster();
  MarkerScope marker;
  RunResult r = run(srunRunSh(cluster, marker, helperPath("env_dump").string()));
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  checkOneJobOfFour(r.out);
  checkNothingLeft(marker);
}

TEST_CASE("slurm: the seed's main.py all-reduces across the nodes with torch.distributed", "[slurm][torch]") {
  SlurmCluster cluster = requireSlurmCluster();
  if (run({{"/usr/bin/python3", "-c", "import torch.distributed"}, {}, {}, 60s}).status() != 0)
    skipTest("/usr/bin/python3 has no torch (Debian's python3-torch)");
  MarkerScope marker;
  RunOptions o = srunRunSh(cluster, marker, std::string(DRUN_SOURCE_DIR) + "/scripts/slurm/main.py");
  o.env.push_back("DRUN_PYTHON=/usr/bin/python3");
  o.timeout = 90s;
  RunResult r = run(o);
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  std::map<int, std::string> said;
  for (const ConsoleLine& line : parseConsole(r.out))
    if (line.text.find("all_reduce") != std::string::npos) said[line.rank] = line.text;
  REQUIRE(said.size() == 4);
  for (const auto& [rank, text] : said) {
    INFO(text);
    CHECK_THAT(text, Catch::StartsWith("rank " + std::to_string(rank) + " of 4 on n" + std::to_string(1 + rank / kNprocPerNode)));
    CHECK_THAT(text, Catch::EndsWith("all_reduce sum 10"));  // 1 + 2 + 3 + 4
  }
  checkNothingLeft(marker);
}

TEST_CASE("slurm: an sbatch job running drun under srun forms one job of 4 workers", "[slurm]") {
  SlurmCluster cluster = requireSlurmCluster();
  MarkerScope marker;
  TempDir tmp;
  RunOptions o;
  // The example batch script docs/slurm.md shows, as a user submits it (sbatch --wait: exits with
  // the job's exit code once it is over).
  o.argv = {slurmTool("sbatch"), "--wait", "--output=" + (tmp / "job.out").string(),
            std::string(DRUN_SOURCE_DIR) + "/scripts/slurm/drun.sbatch", helperPath("env_dump").string()};
  o.env = {cluster.confEnv(), marker.env(), "DRUN=" + drunPath().string(), "NPROC_PER_NODE=2"};
  o.cwd = cluster.jobsDir();
  o.timeout = 60s;
  RunResult r = run(o);
  std::string output = readAll(tmp / "job.out");
  INFO(r.describe() << "\njob output:\n" << output);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  CHECK_THAT(r.out, Catch::Contains("Submitted batch job"));
  checkOneJobOfFour(output);
  checkNothingLeft(marker);
}

TEST_CASE("slurm: a failing worker fails srun and drun names the root cause", "[slurm]") {
  SlurmCluster cluster = requireSlurmCluster();
  MarkerScope marker;
  // Rank 3 (on the second node) fails with 7; the others wait to be stopped.
  RunResult r = run(srunDrun(cluster, marker, 1,
                             {helperPath("behave").string(), "ready", "err:rank {rank} gives up@rank=3",
                              "exit:7@rank=3", "sleep:30000"}));
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  // Both agents end with the job's outcome (the root cause lives in the store), and srun with
  // the highest of its tasks' codes.
  CHECK(r.status() == 7);
  CHECK_THAT(r.err, Catch::Contains("root cause: rank 3 (local_rank 1) on n2") && Catch::Contains("exited with code 7"));
  CHECK_THAT(r.err, Catch::Contains("rank 3 gives up"));
  CHECK_THAT(r.err, Catch::Contains("n1: task 0: Exited with exit code 7"));
  CHECK_THAT(r.err, Catch::Contains("n2: task 1: Exited with exit code 7"));
  checkNothingLeft(marker);
}

TEST_CASE("slurm: scancel of a running job leaves nothing behind", "[slurm]") {
  SlurmCluster cluster = requireSlurmCluster();
  MarkerScope marker;
  Process job(srunDrun(cluster, marker, 1,
                       {helperPath("behave").string(), "env:SLURM_JOB_ID", "ready", "sleep:60000"}));
  REQUIRE(job.waitForLines("READY", 4, 30s));
  std::string jobId;
  job.waitForOutput([&](const std::string& out, const std::string&) {
    std::smatch m;
    if (std::regex_search(out, m, std::regex("SLURM_JOB_ID=([0-9]+)"))) jobId = m[1];
    return !jobId.empty();
  }, 5s);
  REQUIRE_FALSE(jobId.empty());
  // Every worker and agent of the job, found before the cancel by its marker.
  auto before = processesWithEnv(marker.env());
  CHECK(before.size() >= 2 * kNodes + kNodes);  // 4 workers, 2 drun (and srun)

  RunOptions cancel;
  cancel.argv = {slurmTool("scancel"), jobId};
  cancel.env = {cluster.confEnv()};
  RunResult c = run(cancel);
  INFO(c.describe());
  CHECK(c.status() == 0);

  RunResult r = job.wait(30s);
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() != 0);
  // slurmstepd signals the workers and drun: a cancel, not a failure with a root cause.
  CHECK(contains(r.err, "drun: job cancelled: SIGTERM to "));
  CHECK_FALSE(contains(r.err, "root cause"));
  // KillWait=5: SLURM SIGKILLs what ignored SIGTERM after 5 s; drun stops its workers at once.
  checkNothingLeft(marker, 15s);
  RunOptions queue;
  queue.argv = {slurmTool("squeue"), "-h", "-j", jobId, "-o", "%T"};
  queue.env = {cluster.confEnv()};
  RunResult q = run(queue);
  CHECK_THAT(q.out, !Catch::Contains("RUNNING"));
}

TEST_CASE("slurm: several tasks per node is refused and no job is formed", "[slurm]") {
  SlurmCluster cluster = requireSlurmCluster();
  MarkerScope marker;
  RunResult r = run(srunDrun(cluster, marker, 2, {helperPath("env_dump").string()}));
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 2);
  CHECK_THAT(r.err, Catch::Contains("--ntasks-per-node=1") && Catch::Contains("--nproc-per-node"));
  CHECK_THAT(r.out, !Catch::Contains("env:RANK="));  // no worker started
  checkNothingLeft(marker);
}

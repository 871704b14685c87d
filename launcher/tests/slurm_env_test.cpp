#include <stdlib.h>

#include <catch2/catch.hpp>
#include <set>

#include "drun/launcher/cli.hpp"
#include "drun/launcher/slurm_env.hpp"

using namespace drun::launch;

namespace {

// The environment of task `nodeId` of `srun -N<nodes> --ntasks-per-node=1` in job 4242, step 3,
// as SLURM 22.05 sets it (reference/slurm/RECIPE.md's table).
EnvMap srunTask(int nodeId, int nodes = 2, std::string nodelist = "n[1-2]") {
  std::string n = std::to_string(nodes);
  return {{"SLURM_JOB_ID", "4242"},         {"SLURM_JOBID", "4242"},
          {"SLURM_STEP_ID", "3"},           {"SLURM_STEPID", "3"},
          {"SLURM_NODEID", std::to_string(nodeId)},
          {"SLURM_PROCID", std::to_string(nodeId)},
          {"SLURM_STEP_NUM_NODES", n},      {"SLURM_NNODES", n},
          {"SLURM_STEP_NUM_TASKS", n},      {"SLURM_NTASKS", n},
          {"SLURM_NTASKS_PER_NODE", "1"},   {"SLURM_STEP_TASKS_PER_NODE", "1(x" + n + ")"},
          {"SLURM_TASKS_PER_NODE", "1(x" + n + ")"},
          {"SLURM_STEP_NODELIST", nodelist}, {"SLURM_NODELIST", nodelist},
          {"SLURM_JOB_NODELIST", nodelist}};
}

std::string detectError(const EnvMap& env) {
  try {
    detectSlurmStep(env);
  } catch (const UsageError& e) {
    return e.what();
  }
  FAIL("expected a usage error");
  return {};
}

bool never(const std::string&) { return false; }

// Puts a fake SLURM step into the real environment for parseCommandLine, and takes it out again.
struct ScopedSlurmEnv {
  EnvMap vars;
  explicit ScopedSlurmEnv(EnvMap v) : vars(std::move(v)) {
    for (const auto& [k, val] : vars) ::setenv(k.c_str(), val.c_str(), 1);
  }
  ~ScopedSlurmEnv() {
    for (const auto& [k, val] : vars) ::unsetenv(k.c_str());
  }
};

struct ScopedVar {
  std::string name;
  ScopedVar(std::string n, const char* value) : name(std::move(n)) { ::setenv(name.c_str(), value, 1); }
  ~ScopedVar() { ::unsetenv(name.c_str()); }
};

CliResult parseCli(std::vector<std::string> args) {
  args.insert(args.begin(), "drun");
  return parseCommandLine(args);
}

}  // namespace

TEST_CASE("slurm: no step, no detection", "[launcher]") {
  CHECK_FALSE(detectSlurmStep({}));
  EnvMap batch = srunTask(0);  // a batch script: the job without a step
  batch.erase("SLURM_STEP_ID");
  batch.erase("SLURM_STEPID");
  CHECK_FALSE(detectSlurmStep(batch));
  EnvMap noJob = srunTask(0);
  noJob.erase("SLURM_JOB_ID");
  noJob.erase("SLURM_JOBID");
  CHECK_FALSE(detectSlurmStep(noJob));
}

TEST_CASE("slurm: drun in a batch script of several nodes is warned that it uses one", "[launcher]") {
  EnvMap batch = {{"SLURM_JOB_ID", "77"}, {"SLURM_JOB_NUM_NODES", "2"}, {"SLURM_NNODES", "2"},
                  {"SLURM_NODEID", "0"}, {"SLURM_JOB_NODELIST", "n[1-2]"}};
  auto warning = slurmOutsideStepWarning(batch);
  REQUIRE(warning);
  CHECK_THAT(*warning, Catch::Contains("SLURM job 77 has 2 nodes") && Catch::Contains("srun --ntasks-per-node=1"));
  batch["SLURM_JOB_NUM_NODES"] = "1";
  CHECK_FALSE(slurmOutsideStepWarning(batch));
  CHECK_FALSE(slurmOutsideStepWarning(srunTask(0)));  // in a step: detection, not a warning
  CHECK_FALSE(slurmOutsideStepWarning({}));
}

TEST_CASE("slurm: a step gives node count, node id, first host and ids", "[launcher]") {
  auto step = detectSlurmStep(srunTask(1, 4, "gpu[007-010]"));
  REQUIRE(step);
  CHECK(step->jobId == 4242);
  CHECK(step->stepId == 3);
  CHECK(step->nodeCount == 4);
  CHECK(step->nodeId == 1);
  CHECK(step->firstHost == "gpu007");
  CHECK(step->nodelistVar == "SLURM_STEP_NODELIST");

  // Older SLURMs (and salloc shells) without the SLURM_STEP_* variables: the job's.
  EnvMap old = {{"SLURM_JOBID", "7"}, {"SLURM_STEPID", "0"}, {"SLURM_NNODES", "2"},
                {"SLURM_NODEID", "0"}, {"SLURM_NODELIST", "a1,b[2-3]c"}};
  auto fallback = detectSlurmStep(old);
  REQUIRE(fallback);
  CHECK(fallback->nodeCount == 2);
  CHECK(fallback->firstHost == "a1");
  CHECK(fallback->nodelistVar == "SLURM_NODELIST");
}

TEST_CASE("slurm: the rendezvous port is shared by a step and differs between steps and jobs", "[launcher]") {
  CHECK(slurmRendezvousPort(4242, 3) == slurmRendezvousPort(4242, 3));
  CHECK(slurmRendezvousPort(4242, 3) != slurmRendezvousPort(4242, 4));
  CHECK(slurmRendezvousPort(4242, 3) != slurmRendezvousPort(4243, 3));
  // Any two jobs less than 1000 apart, any two steps less than 8 apart: all distinct, all in range.
  std::set<uint16_t> ports;
  for (uint64_t job = 123456; job < 123456 + 1000; ++job)
    for (uint64_t step = 0; step < 8; ++step) {
      uint16_t port = slurmRendezvousPort(job, step);
      CHECK((port >= 20000 && port < 28000));
      ports.insert(port);
    }
  CHECK(ports.size() == 8000);
  // Special steps (batch, extern: 0xfffffffb..) stay in range too.
  uint16_t special = slurmRendezvousPort(4294967295ULL, 4294967291ULL);
  CHECK((special >= 20000 && special < 28000));
}

TEST_CASE("slurm: the fill takes only what was not given", "[launcher]") {
  auto step = detectSlurmStep(srunTask(0));
  REQUIRE(step);
  std::string port = std::to_string(slurmRendezvousPort(4242, 3));
  SlurmFill all = slurmFill(*step, never);
  using Options = std::vector<std::pair<std::string, std::string>>;
  CHECK(all.options == Options{{"nnodes", "2"}, {"node-rank", "0"}, {"rdzv-endpoint", "n1:" + port}, {"rdzv-id", "4242.3"}});
  CHECK(all.isHost == true);
  CHECK_THAT(all.describe(*step), Catch::Contains("--rdzv-endpoint n1:" + port) && Catch::Contains("4242.3"));

  auto second = detectSlurmStep(srunTask(1));
  SlurmFill other = slurmFill(*second, never);
  CHECK(other.isHost == false);

  SlurmFill some = slurmFill(*step, [](const std::string& name) { return name == "rdzv-endpoint" || name == "nnodes"; });
  CHECK(some.options == Options{{"node-rank", "0"}, {"rdzv-id", "4242.3"}});
  CHECK_FALSE(some.isHost);  // the user's endpoint: its own is_host rule

  SlurmFill none = slurmFill(*step, [](const std::string&) { return true; });
  CHECK(none.options.empty());
  CHECK_THAT(none.describe(*step), Catch::Contains("took nothing"));
}

TEST_CASE("slurm: several tasks per node is an error telling what to write", "[launcher]") {
  EnvMap perNode = srunTask(0);  // srun -N2 --ntasks-per-node=2
  perNode["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
  perNode["SLURM_TASKS_PER_NODE"] = "2(x2)";
  perNode["SLURM_NTASKS_PER_NODE"] = "2";
  perNode["SLURM_STEP_NUM_TASKS"] = "4";
  std::string e = detectError(perNode);
  CHECK_THAT(e, Catch::Contains("SLURM_STEP_TASKS_PER_NODE=2(x2)"));
  CHECK_THAT(e, Catch::Contains("--ntasks-per-node=1") && Catch::Contains("--nproc-per-node"));

  EnvMap uneven = srunTask(0);  // srun -N2 -n3
  uneven["SLURM_STEP_TASKS_PER_NODE"] = "2,1";
  uneven.erase("SLURM_NTASKS_PER_NODE");
  CHECK_THAT(detectError(uneven), Catch::Contains("2,1"));

  EnvMap onlyJob = srunTask(0);  // no step-level counts: the job's SLURM_NTASKS_PER_NODE
  onlyJob.erase("SLURM_STEP_TASKS_PER_NODE");
  onlyJob.erase("SLURM_TASKS_PER_NODE");
  onlyJob["SLURM_NTASKS_PER_NODE"] = "4";
  CHECK_THAT(detectError(onlyJob), Catch::Contains("SLURM_NTASKS_PER_NODE=4"));

  EnvMap moreTasks = srunTask(0);  // counts absent, more tasks than nodes
  moreTasks.erase("SLURM_STEP_TASKS_PER_NODE");
  moreTasks.erase("SLURM_TASKS_PER_NODE");
  moreTasks.erase("SLURM_NTASKS_PER_NODE");
  moreTasks["SLURM_STEP_NUM_TASKS"] = "3";
  CHECK_THAT(detectError(moreTasks), Catch::Contains("3 tasks on 2 nodes"));

  // A job's SLURM_NTASKS_PER_NODE=4 inherited by an srun that runs one task per node is fine:
  // the step's own counts decide.
  EnvMap inherited = srunTask(0);
  inherited["SLURM_NTASKS_PER_NODE"] = "4";
  CHECK(detectSlurmStep(inherited));
}

TEST_CASE("slurm: malformed variables are errors naming the variable", "[launcher]") {
  auto broken = [](const char* name, const char* value) {
    EnvMap env = srunTask(0);
    env[name] = value;
    return detectError(env);
  };
  CHECK_THAT(broken("SLURM_JOB_ID", "abc"), Catch::Contains("SLURM_JOB_ID"));
  CHECK_THAT(broken("SLURM_STEP_ID", "-1"), Catch::Contains("SLURM_STEP_ID"));
  CHECK_THAT(broken("SLURM_NODEID", "2"), Catch::Contains("SLURM_NODEID"));  // node 2 of 2
  CHECK_THAT(broken("SLURM_STEP_NUM_NODES", "0"), Catch::Contains("SLURM_STEP_NUM_NODES"));
  CHECK_THAT(broken("SLURM_STEP_NODELIST", "n[1-2"), Catch::Contains("SLURM_STEP_NODELIST") && Catch::Contains("unbalanced"));
  CHECK_THAT(broken("SLURM_STEP_NODELIST", "n[1-3]"), Catch::Contains("names 3 nodes"));
  CHECK_THAT(broken("SLURM_STEP_TASKS_PER_NODE", "1(x2"), Catch::Contains("SLURM_STEP_TASKS_PER_NODE"));
  CHECK_THAT(broken("SLURM_STEP_TASKS_PER_NODE", "x"), Catch::Contains("SLURM_STEP_TASKS_PER_NODE"));
  EnvMap missing = srunTask(0);
  missing.erase("SLURM_NODEID");
  CHECK_THAT(detectError(missing), Catch::Contains("SLURM_NODEID is not set"));
  CHECK_THAT(detectError(missing), Catch::Contains("--no-slurm"));  // the way out is named
}

TEST_CASE("slurm: command line beats PET_ beats SLURM and --no-slurm turns it off", "[launcher]") {
  ScopedSlurmEnv slurm(srunTask(1, 2, "node[07-08]"));
  std::string port = std::to_string(slurmRendezvousPort(4242, 3));

  auto all = parseCli({"--nproc-per-node", "2", "hostname"});
  const auto& r = all.config.rendezvous;
  CHECK(r.minNodes == 2);
  CHECK(r.maxNodes == 2);
  CHECK(r.nodeRank == 1);
  CHECK(r.endpoint.host == "node07");
  CHECK(r.endpoint.port == std::stoi(port));
  CHECK(r.runId == "4242.3");
  CHECK(r.isHost == false);
  REQUIRE(all.notes.size() == 1);
  CHECK_THAT(all.notes[0], Catch::Contains("SLURM step 4242.3") && Catch::Contains("--nnodes 2"));

  {
    ScopedVar pet("PET_RDZV_ID", "from-pet");
    ScopedVar petNodes("PET_NNODES", "1:2");
    auto c = parseCli({"hostname"}).config.rendezvous;
    CHECK(c.runId == "from-pet");
    CHECK(c.minNodes == 1);
    CHECK(c.maxNodes == 2);
    CHECK(c.endpoint.host == "node07");  // still SLURM's
    auto cli = parseCli({"--rdzv-id", "from-cli", "--nnodes", "2", "hostname"}).config.rendezvous;
    CHECK(cli.runId == "from-cli");
    CHECK(cli.minNodes == 2);
  }

  auto own = parseCli({"--rdzv-endpoint", "elsewhere:1234", "--node-rank", "0", "hostname"}).config.rendezvous;
  CHECK(own.endpoint.host == "elsewhere");
  CHECK(own.endpoint.port == 1234);
  CHECK(own.nodeRank == 0);
  CHECK_FALSE(own.isHost);  // the user's endpoint: decided by address, not by SLURM
  CHECK(own.runId == "4242.3");

  auto conf = parseCli({"--rdzv-conf", "is_host=1", "hostname"}).config.rendezvous;
  CHECK(conf.isHost == true);  // the user's is_host wins over SLURM's choice

  auto off = parseCli({"--no-slurm", "hostname"});
  CHECK(off.config.rendezvous.maxNodes == 1);
  CHECK(off.config.rendezvous.endpoint.host.empty());
  CHECK(off.config.rendezvous.runId == "none");
  CHECK(off.notes.empty());

  auto standalone = parseCli({"--standalone", "hostname"});
  CHECK(standalone.config.rendezvous.maxNodes == 1);
  CHECK(standalone.notes.empty());
}

TEST_CASE("slurm: several tasks per node stops drun before anything starts", "[launcher]") {
  EnvMap env = srunTask(0);
  env["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
  env["SLURM_STEP_NUM_TASKS"] = "4";
  ScopedSlurmEnv slurm(env);
  try {
    parseCli({"--nproc-per-node", "2", "hostname"});
    FAIL("expected a usage error");
  } catch (const UsageError& e) {
    CHECK_THAT(e.what(), Catch::Contains("--ntasks-per-node=1"));
  }
  CHECK(parseCli({"--no-slurm", "hostname"}).config.rendezvous.maxNodes == 1);
}

TEST_CASE("slurm: the batch-script warning reaches the command line's result", "[launcher]") {
  ScopedSlurmEnv slurm({{"SLURM_JOB_ID", "77"}, {"SLURM_JOB_NUM_NODES", "2"}});
  auto r = parseCli({"hostname"});
  REQUIRE(r.warnings.size() == 1);
  CHECK_THAT(r.warnings[0], Catch::Contains("this node only"));
  CHECK(r.config.rendezvous.maxNodes == 1);  // nothing taken: there is no step
  CHECK(parseCli({"--no-slurm", "hostname"}).warnings.empty());
}

#include <catch2/catch.hpp>
#include <map>

#include "drun/agent/worker_env.hpp"

using namespace drun::agent;

namespace {
std::map<std::string, std::string> asMap(const std::vector<std::string>& env) {
  std::map<std::string, std::string> out;
  for (const auto& e : env) {
    auto eq = e.find('=');
    REQUIRE(eq != std::string::npos);
    REQUIRE(out.emplace(e.substr(0, eq), e.substr(eq + 1)).second);  // no duplicates
  }
  return out;
}
}  // namespace

TEST_CASE("workers get the torchrun environment of their round", "[agent]") {
  AgentConfig config;
  config.nprocPerNode = 4;
  config.program = {"/bin/echo", "--rank=${local_rank}", "x${local_rank}y${local_rank}"};
  config.rendezvous.maxRestarts = 3;
  config.role = "trainer";
  config.rendezvous.runId = "job7";
  drun::rdzv::RoundResult round;
  round.nodeRank = 1;
  round.nodeCount = 2;
  round.worldSize = 8;
  round.rankOffset = 4;
  round.masterAddr = "10.0.0.1";
  round.masterPort = 4321;
  AttemptContext attempt;
  attempt.restartCount = 2;
  attempt.attemptDir = "/tmp/j/attempt_2";
  attempt.baseEnvironment = {"PATH=/bin", "RANK=99", "HOME=/root"};
  attempt.cpuCount = 8;

  auto specs = buildWorkerSpecs(config, round, attempt);
  REQUIRE(specs.size() == 4);
  for (int i = 0; i < 4; ++i) {
    auto env = asMap(specs[i].env);
    CHECK(specs[i].localRank == i);
    CHECK(specs[i].globalRank == 4 + i);
    CHECK(env["RANK"] == std::to_string(4 + i));
    CHECK(env["LOCAL_RANK"] == std::to_string(i));
    CHECK(env["ROLE_RANK"] == std::to_string(4 + i));
    CHECK(env["WORLD_SIZE"] == "8");
    CHECK(env["LOCAL_WORLD_SIZE"] == "4");
    CHECK(env["GROUP_RANK"] == "1");
    CHECK(env["GROUP_WORLD_SIZE"] == "2");
    CHECK(env["ROLE_NAME"] == "trainer");
    CHECK(env["ROLE_WORLD_SIZE"] == "8");
    CHECK(env["MASTER_ADDR"] == "10.0.0.1");
    CHECK(env["MASTER_PORT"] == "4321");
    CHECK(env["TORCHELASTIC_RUN_ID"] == "job7");
    CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "2");
    CHECK(env["TORCHELASTIC_MAX_RESTARTS"] == "3");
    CHECK(env["TORCHELASTIC_USE_AGENT_STORE"] == "False");
    CHECK(env["TORCHELASTIC_ERROR_FILE"] == "/tmp/j/attempt_2/" + std::to_string(i) + "/error.json");
    CHECK(env["OMP_NUM_THREADS"] == "2");
    CHECK(env["PATH"] == "/bin");
    CHECK(env["HOME"] == "/root");
    CHECK(specs[i].argv[1] == "--rank=" + std::to_string(i));
    CHECK(specs[i].argv[2] == "x" + std::to_string(i) + "y" + std::to_string(i));
  }
}

TEST_CASE("a user's OMP_NUM_THREADS and PYTHONUNBUFFERED are kept", "[agent]") {
  AgentConfig config;
  config.nprocPerNode = 2;
  config.program = {"/bin/true"};
  config.isPython = true;
  drun::rdzv::RoundResult round;
  AttemptContext attempt;
  attempt.baseEnvironment = {"OMP_NUM_THREADS=7"};
  auto env = asMap(buildWorkerSpecs(config, round, attempt)[0].env);
  CHECK(env["OMP_NUM_THREADS"] == "7");
  CHECK(env["PYTHONUNBUFFERED"] == "1");
  attempt.baseEnvironment = {"PYTHONUNBUFFERED=0"};
  CHECK(asMap(buildWorkerSpecs(config, round, attempt)[1].env)["PYTHONUNBUFFERED"] == "0");
}

TEST_CASE("OMP_NUM_THREADS default is cores per worker, at least one", "[agent]") {
  CHECK(defaultOmpThreads(2, 4) == 1);
  CHECK(defaultOmpThreads(16, 4) == 4);
  CHECK(defaultOmpThreads(1, 1) == 1);
}

TEST_CASE("recovery: in-process workers get the workers' store, a replacement its generation and count",
          "[agent]") {
  AgentConfig config;
  config.nprocPerNode = 2;
  config.program = {"/bin/true"};
  drun::rdzv::RoundResult round;
  round.worldSize = 4;
  round.rankOffset = 2;
  AttemptContext attempt;
  attempt.restartCount = 1;
  // An outer drun's variables never leak into the workers.
  attempt.baseEnvironment = {"DRUN_WORKER_STORE=10.0.0.9:1", "DRUN_GENERATION=7", "DRUN_RECOVERY=in-process"};

  SECTION("restart: none of them") {
    auto env = asMap(buildWorkerSpecs(config, round, attempt).at(0).env);
    for (const char* name : {"DRUN_RECOVERY", "DRUN_WORKER_STORE", "DRUN_WORKER_STORE_PREFIX", "DRUN_GENERATION"})
      CHECK(env.count(name) == 0);
  }
  SECTION("in-process") {
    attempt.workerStore = "127.0.0.1:4242";
    attempt.workerStorePrefix = "rdzv/job/3/workers/";
    for (const auto& spec : buildWorkerSpecs(config, round, attempt)) {
      auto env = asMap(spec.env);
      CHECK(env["DRUN_RECOVERY"] == "in-process");
      CHECK(env["DRUN_WORKER_STORE"] == "127.0.0.1:4242");
      CHECK(env["DRUN_WORKER_STORE_PREFIX"] == "rdzv/job/3/workers/");
      CHECK(env["DRUN_GENERATION"] == "0");
      CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "1");
    }
    attempt.generation = 2;
    attempt.restartCount = 3;
    const WorkerSpec replacement = buildWorkerSpec(config, round, attempt, 1);
    auto env = asMap(replacement.env);
    CHECK(replacement.localRank == 1);
    CHECK(replacement.globalRank == 3);
    CHECK(env["RANK"] == "3");
    CHECK(env["LOCAL_RANK"] == "1");
    CHECK(env["DRUN_GENERATION"] == "2");
    CHECK(env["TORCHELASTIC_RESTART_COUNT"] == "3");
  }
}

TEST_CASE("virtual local rank: LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES narrowed, as torchrun", "[agent]") {
  AgentConfig config;
  config.nprocPerNode = 3;
  config.program = {"/bin/echo", "${local_rank}"};
  config.virtualLocalRank = true;
  drun::rdzv::RoundResult round;
  round.worldSize = 6;
  round.rankOffset = 3;
  AttemptContext attempt;
  attempt.attemptDir = "/tmp/j/attempt_0";

  // drun's CUDA_VISIBLE_DEVICES: each rank gets its own entry, stripped.
  attempt.baseEnvironment = {"PATH=/bin", "CUDA_VISIBLE_DEVICES=4, 6 ,GPU-abc"};
  auto specs = buildWorkerSpecs(config, round, attempt);
  const char* expected[] = {"4", "6", "GPU-abc"};
  for (int i = 0; i < 3; ++i) {
    auto env = asMap(specs[i].env);
    CHECK(env["LOCAL_RANK"] == "0");
    CHECK(env["CUDA_VISIBLE_DEVICES"] == expected[i]);
    CHECK(env["RANK"] == std::to_string(3 + i));           // the other ranks stay true
    CHECK(specs[i].argv[1] == std::to_string(i));          // as torchrun's ${local_rank} macro
    CHECK(env["TORCHELASTIC_ERROR_FILE"] == "/tmp/j/attempt_0/" + std::to_string(i) + "/error.json");
  }
  // None: the local rank's number.
  attempt.baseEnvironment = {"PATH=/bin"};
  CHECK(asMap(buildWorkerSpecs(config, round, attempt)[2].env)["CUDA_VISIBLE_DEVICES"] == "2");
  // Off: LOCAL_RANK true, drun's CUDA_VISIBLE_DEVICES passed on whole.
  config.virtualLocalRank = false;
  attempt.baseEnvironment = {"CUDA_VISIBLE_DEVICES=4,6,7"};
  auto plain = asMap(buildWorkerSpecs(config, round, attempt)[1].env);
  CHECK(plain["LOCAL_RANK"] == "1");
  CHECK(plain["CUDA_VISIBLE_DEVICES"] == "4,6,7");
  CHECK(splitDeviceList("") == std::vector<std::string>{""});
  CHECK(splitDeviceList(" 0 ,1") == std::vector<std::string>{"0", "1"});
}

TEST_CASE("numa binding: each local rank's spec carries its binding", "[agent][numa]") {
  AgentConfig config;
  config.nprocPerNode = 2;
  config.program = {"/bin/true"};
  AttemptContext attempt;
  attempt.bindings = {{{0, 1}, {0}}, {{2, 3}, {}}};
  auto specs = buildWorkerSpecs(config, drun::rdzv::RoundResult{}, attempt);
  CHECK(specs[0].binding.cpus == std::vector<int>{0, 1});
  CHECK(specs[0].binding.memNodes == std::vector<int>{0});
  CHECK(specs[1].binding.cpus == std::vector<int>{2, 3});
  CHECK(buildWorkerSpec(config, drun::rdzv::RoundResult{}, attempt, 1).binding.cpus == std::vector<int>{2, 3});
  attempt.bindings.clear();
  CHECK(buildWorkerSpecs(config, drun::rdzv::RoundResult{}, attempt)[0].binding.cpus.empty());
}

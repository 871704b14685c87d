#include <stdlib.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <regex>

#include "drun/launcher/cli.hpp"

using drun::launch::parseCommandLine;
using drun::launch::UsageError;
using namespace std::chrono_literals;

namespace {

drun::agent::AgentConfig parse(std::vector<std::string> args) {
  args.insert(args.begin(), "drun");
  auto result = parseCommandLine(args);
  REQUIRE_FALSE(result.printAndExit);
  return result.config;
}

std::string usageError(std::vector<std::string> args) {
  args.insert(args.begin(), "drun");
  try {
    parseCommandLine(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  FAIL("expected a usage error");
  return {};
}

// Sets an environment variable for the scope of one test.
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) { ::setenv(name.c_str(), value, 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

}  // namespace

TEST_CASE("defaults follow torchrun", "[launcher]") {
  auto c = parse({"hostname"});
  CHECK(c.nprocPerNode == 1);
  CHECK(c.rendezvous.maxRestarts == 0);
  CHECK(c.role == "default");
  CHECK(c.shutdownTimeout == 30s);
  CHECK(c.rendezvous.minNodes == 1);
  CHECK(c.rendezvous.maxNodes == 1);
  CHECK(c.rendezvous.runId == "none");
  CHECK(c.program.size() == 1);
  CHECK(c.program[0].ends_with("/hostname"));
  CHECK_FALSE(c.prefixTemplate);
}

TEST_CASE("dash and underscore spellings are both accepted", "[launcher]") {
  CHECK(parse({"--nproc-per-node", "3", "hostname"}).nprocPerNode == 3);
  CHECK(parse({"--nproc_per_node=5", "hostname"}).nprocPerNode == 5);
  CHECK(parse({"--max_restarts", "2", "hostname"}).rendezvous.maxRestarts == 2);
  CHECK(parse({"--max-restarts=4", "hostname"}).rendezvous.maxRestarts == 4);
}

TEST_CASE("program arguments are passed through untouched", "[launcher]") {
  auto c = parse({"--nproc-per-node", "2", "echo", "--nproc-per-node", "9", "-x", "${local_rank}"});
  CHECK(c.nprocPerNode == 2);
  REQUIRE(c.program.size() == 5);
  CHECK(c.program[1] == "--nproc-per-node");
  CHECK(c.program[4] == "${local_rank}");
  auto d = parse({"--", "echo", "a"});
  CHECK(d.program.size() == 2);
}

TEST_CASE("PET_ variables set options and the command line wins", "[launcher]") {
  ScopedEnv nproc("PET_NPROC_PER_NODE", "3");
  ScopedEnv restarts("PET_MAX_RESTARTS", "7");
  auto c = parse({"hostname"});
  CHECK(c.nprocPerNode == 3);
  CHECK(c.rendezvous.maxRestarts == 7);
  CHECK(parse({"--nproc-per-node", "2", "hostname"}).nprocPerNode == 2);
}

TEST_CASE("nproc-per-node accepts cpu and auto", "[launcher]") {
  CHECK(parse({"--nproc-per-node", "cpu", "hostname"}).nprocPerNode >= 1);
  CHECK(parse({"--nproc-per-node", "auto", "hostname"}).nprocPerNode >= 1);
}

TEST_CASE("standalone gets a private random run id", "[launcher]") {
  auto a = parse({"--standalone", "hostname"});
  auto b = parse({"--standalone", "hostname"});
  CHECK(a.rendezvous.runId != "none");
  CHECK(a.rendezvous.runId != b.rendezvous.runId);
}

TEST_CASE("python programs and modules run under the interpreter", "[launcher]") {
  ScopedEnv python("PYTHON_EXEC", "/bin/sh");  // any executable stands in for python here
  auto m = parse({"-m", "json.tool", "x"});
  CHECK(m.isPython);
  CHECK(m.program == std::vector<std::string>{"/bin/sh", "-u", "-m", "json.tool", "x"});
  CHECK(usageError({"-m", "--no-python", "json.tool"}).find("--no-python") != std::string::npos);
  CHECK(usageError({"missing_script.py"}).find("missing_script.py") != std::string::npos);
}

TEST_CASE("multi-node and rendezvous options fill RendezvousOptions", "[launcher]") {
  auto c = parse({"--nnodes", "2:4", "--rdzv-endpoint", "node0:1234", "--rdzv-id", "job7",
                  "--rdzv-conf", "join_timeout=5,last_call_timeout=250ms,is_host=1",
                  "--node-rank", "1", "--local-addr", "10.0.0.2", "hostname"});
  CHECK(c.rendezvous.minNodes == 2);
  CHECK(c.rendezvous.maxNodes == 4);
  CHECK(c.rendezvous.endpoint.host == "node0");
  CHECK(c.rendezvous.endpoint.port == 1234);
  CHECK(c.rendezvous.runId == "job7");
  CHECK(c.rendezvous.joinTimeout == 5000ms);
  CHECK(c.rendezvous.lastCallTimeout == 250ms);
  CHECK(c.rendezvous.isHost == true);
  CHECK(c.rendezvous.nodeRank == 1);
  CHECK(c.rendezvous.localAddr == "10.0.0.2");
  auto v6 = parse({"--nnodes", "2", "--rdzv-endpoint", "[::1]:5000", "hostname"});
  CHECK(v6.rendezvous.endpoint.host == "::1");
  CHECK(v6.rendezvous.endpoint.port == 5000);
  CHECK(parse({"--nnodes", "2", "--rdzv-endpoint", "h", "hostname"}).rendezvous.endpoint.port == 29400);
  CHECK(parse({"--nnodes", "2", "--rdzv-endpoint", "[::1]", "hostname"}).rendezvous.endpoint ==
        drun::HostPort{"::1", 29400});
  // A bare IPv6 address is ambiguous ("fe80::1:2940": a port or not): brackets are asked for.
  CHECK_THAT(usageError({"--nnodes", "2", "--rdzv-endpoint", "fe80::1:2940", "hostname"}),
             Catch::Contains("--rdzv-endpoint 'fe80::1:2940': write an IPv6 address in brackets"));
  CHECK_THAT(usageError({"--nnodes", "2", "--rdzv-endpoint", "h:70000", "hostname"}),
             Catch::Contains("--rdzv-endpoint 'h:70000': port 70000 is out of range (1-65535)"));
  // Port 0 is no endpoint: nobody could join a store on "any port".
  CHECK_THAT(usageError({"--nnodes", "2", "--rdzv-endpoint", "h:0", "hostname"}),
             Catch::Contains("--rdzv-endpoint 'h:0': port 0 is out of range (1-65535)"));
  CHECK_THAT(usageError({"--nnodes", "2", "--rdzv-endpoint", ":5", "hostname"}), Catch::Contains("missing host"));
}

TEST_CASE("redirects, tee and the console filter parse torchrun's formats", "[launcher]") {
  auto c = parse({"--nproc-per-node", "4", "-r", "3", "--tee", "0:1,2:2", "--local-ranks-filter", "0,2", "hostname"});
  CHECK(c.output.defaultRouting.redirect == 3);
  CHECK(c.output.routing.at(0).tee == 1);
  CHECK(c.output.routing.at(2).tee == 2);
  CHECK(c.output.routing.at(0).redirect == 3);  // a per-rank entry keeps the other option's value
  CHECK(c.output.routing.at(2).redirect == 3);
  // The other way round: a single value reaches the per-rank entries made before it.
  auto d = parse({"--nproc-per-node", "2", "-r", "0:1", "-t", "3", "hostname"});
  CHECK(d.output.routing.at(0).redirect == 1);
  CHECK(d.output.routing.at(0).tee == 3);
  CHECK(d.output.defaultRouting.redirect == 0);
  CHECK(d.output.defaultRouting.tee == 3);
  REQUIRE(c.output.consoleLocalRanks);
  CHECK(*c.output.consoleLocalRanks == std::vector<int>{0, 2});
  CHECK(parse({"--prefix", "", "hostname"}).prefixTemplate == std::string());
}

TEST_CASE("every bad input is a usage error naming what was wrong", "[launcher]") {
  CHECK_THAT(usageError({"--bogus", "hostname"}), Catch::Contains("--bogus"));
  CHECK_THAT(usageError({}), Catch::Contains("missing the program"));
  CHECK_THAT(usageError({"--nproc-per-node", "0", "hostname"}), Catch::Contains("--nproc-per-node"));
  CHECK_THAT(usageError({"--nproc-per-node", "-2", "hostname"}), Catch::Contains("--nproc-per-node"));
  CHECK_THAT(usageError({"--nproc-per-node", "many", "hostname"}), Catch::Contains("--nproc-per-node"));
  CHECK_THAT(usageError({"no-such-program-xyz"}), Catch::Contains("no-such-program-xyz"));
  CHECK_THAT(usageError({"/etc/passwd"}), Catch::Contains("not executable"));
  CHECK_THAT(usageError({"/tmp"}), Catch::Contains("directory"));
  CHECK_THAT(usageError({"--nproc-per-node", "2", "--local-ranks-filter", "0,x", "hostname"}),
             Catch::Contains("--local-ranks-filter"));
  CHECK_THAT(usageError({"--nproc-per-node", "2", "--local-ranks-filter", "5", "hostname"}),
             Catch::Contains("--local-ranks-filter"));
  CHECK_THAT(usageError({"--nnodes", "3:2", "hostname"}), Catch::Contains("--nnodes"));
  CHECK_THAT(usageError({"--nnodes", "a:b", "hostname"}), Catch::Contains("--nnodes"));
  CHECK_THAT(usageError({"--nnodes", "0", "hostname"}), Catch::Contains("--nnodes"));
  CHECK_THAT(usageError({"--nnodes", "2:70000", "hostname"}), Catch::Contains("--nnodes"));
  CHECK_THAT(usageError({"--nnodes", "2", "hostname"}), Catch::Contains("--node-rank"));
  CHECK_THAT(usageError({"--nnodes", "2", "--rdzv-backend", "c10d", "hostname"}), Catch::Contains("--rdzv-endpoint"));
  CHECK_THAT(usageError({"--nnodes", "1:2", "hostname"}), Catch::Contains("--rdzv-endpoint"));
  CHECK_THAT(usageError({"--run-path", "x.py"}), Catch::Contains("--run-path"));
  CHECK_THAT(usageError({"--max-restarts", "-1", "hostname"}), Catch::Contains("--max-restarts"));
  CHECK_THAT(usageError({"--redirects", "4", "hostname"}), Catch::Contains("--redirects"));
  CHECK_THAT(usageError({"--rdzv-conf", "bogus=1", "hostname"}), Catch::Contains("bogus"));
  CHECK_THAT(usageError({"--rdzv-backend", "etcd", "hostname"}), Catch::Contains("etcd"));
  CHECK_THAT(usageError({"--rdzv-backend", "zookeeper", "hostname"}),
             Catch::Contains("--rdzv-backend: 'zookeeper' is not supported (use c10d, etcd or static)"));
  CHECK_THAT(usageError({"--rdzv-backend", "static", "--nnodes", "1:2", "hostname"}),
             Catch::Contains("--rdzv-backend static needs a fixed --nnodes, got 1:2"));
  CHECK_THAT(usageError({"--standalone", "--nnodes", "2", "hostname"}), Catch::Contains("--standalone"));
  CHECK_THAT(usageError({"--shutdown-timeout", "soon", "hostname"}), Catch::Contains("--shutdown-timeout"));
}

TEST_CASE("help is printed, not an error", "[launcher]") {
  auto r = parseCommandLine({"drun", "--help"});
  REQUIRE(r.printAndExit);
  CHECK_THAT(*r.printAndExit, Catch::Contains("--nproc-per-node"));
}

TEST_CASE("the classic static torchrun line runs with the static backend", "[launcher]") {
  auto c = parse({"--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1", "--master_port=29555",
                  "--nproc_per_node=2", "hostname"});
  CHECK(c.rendezvous.backend == drun::rdzv::RendezvousBackend::Static);
  CHECK(c.rendezvous.nodeRank == 1);
  CHECK(c.rendezvous.masterAddr == "10.0.0.1");
  CHECK(c.rendezvous.masterPort == 29555);
  CHECK(c.nprocPerNode == 2);
  // An endpoint means the c10d rendezvous, as before.
  CHECK(parse({"--nnodes", "2", "--rdzv-endpoint", "h:1", "hostname"}).rendezvous.backend == drun::rdzv::RendezvousBackend::C10d);
}

TEST_CASE("torchrun's lenient spellings are accepted with a warning where torchrun warns", "[launcher]") {
  auto r = parseCommandLine({"drun", "--standalone", "--rdzv-endpoint", "h:5", "hostname"});
  CHECK(r.config.rendezvous.endpoint.host.empty());
  CHECK(r.config.rendezvous.runId != "none");
  REQUIRE(r.warnings.size() == 1);
  CHECK_THAT(r.warnings[0], Catch::Contains("--standalone ignores --rdzv-endpoint h:5"));
  CHECK(parseCommandLine({"drun", "--log_level", "debug", "hostname"}).logLevel == "debug");
  CHECK(parseCommandLine({"drun", "--log-level=info", "hostname"}).logLevel == "info");
}

TEST_CASE("a prefix with an unknown macro is refused", "[launcher]") {
  CHECK_THAT(usageError({"--prefix", "${bogus}", "hostname"}), Catch::Contains("${bogus}"));
  CHECK_THAT(usageError({"--prefix", "[${rank", "hostname"}), Catch::Contains("unterminated"));
  CHECK(parse({"--prefix", "${hostname}/${local_rank} ${role_name}:${rank}|", "hostname"}).prefixTemplate);
}

TEST_CASE("generated run ids always have 32 hex digits", "[launcher]") {
  for (int i = 0; i < 200; ++i) {
    const std::string id = parse({"--standalone", "hostname"}).rendezvous.runId;
    REQUIRE(id.size() == 32);
    REQUIRE(id.find_first_not_of("0123456789abcdef") == std::string::npos);
  }
}

TEST_CASE("a missing interpreter names the variable that chose it", "[launcher]") {
  {
    ScopedEnv python("PYTHON_EXEC", "/nonexistent/python");
    std::string e = usageError({"-m", "json.tool"});
    CHECK_THAT(e, Catch::Contains("PYTHON_EXEC"));
    CHECK_THAT(e, Catch::Contains("/nonexistent/python"));
  }
  ScopedEnv python("PYTHON_EXEC", "/bin/sh");
  CHECK_THAT(parse({"-m", "json.tool"}).interpreter, Catch::Contains("/bin/sh (PYTHON_EXEC)"));
}

TEST_CASE("help shows value names, defaults, the rdzv-conf keys and the environment", "[launcher]") {
  const std::string help = *parseCommandLine({"drun", "--help"}).printAndExit;
  for (const char* text : {"N|MIN:MAX", "HOST[:PORT]", "N|auto|cpu|gpu", "join_timeout=DURATION (600s)",
                           "last_call_timeout=DURATION (30s)", "heartbeat_timeout=DURATION (5s)",
                           "PYTHON_EXEC", "DRUN_LOG_LEVEL", "PET_<OPTION>", "(default 29500)"})
    CHECK_THAT(help, Catch::Contains(text));
  CHECK_THAT(help, !Catch::Contains(" TEXT"));
}

// The option reference's tables (docs/options.md) stay true to --help: every long option and
// every DRUN_ variable --help lists is documented there.
TEST_CASE("docs/options.md documents every option and variable of --help", "[launcher]") {
  std::ifstream in(std::string(DRUN_SOURCE_DIR) + "/docs/options.md");
  REQUIRE(in);
  const std::string readme((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string help = *parseCommandLine({"drun", "--help"}).printAndExit;
  std::regex option(R"((?:^|\s)(--[a-z][a-z-]+)[ ,=])");
  int checked = 0;
  for (auto it = std::sregex_iterator(help.begin(), help.end(), option); it != std::sregex_iterator(); ++it) {
    const std::string name = (*it)[1];
    if (name == "--help" || name == "--version") continue;
    INFO(name);
    CHECK(readme.find("`" + name) != std::string::npos);
    ++checked;
  }
  CHECK(checked >= 25);
  std::regex var(R"(\b(DRUN_[A-Z_]+|PYTHON_EXEC)\b)");
  for (auto it = std::sregex_iterator(help.begin(), help.end(), var); it != std::sregex_iterator(); ++it) {
    INFO((*it)[1]);
    CHECK(readme.find((*it)[1].str()) != std::string::npos);
  }
}

TEST_CASE("hang options reach the agent's config, from the command line and PET_", "[launcher][hangs]") {
  auto off = parse({"/bin/true"});
  CHECK_FALSE(off.hangs.detects());
  auto c = parse({"--hang-timeout", "30,step=3m", "--hang_idle", "120", "/bin/true"});
  CHECK(c.hangs.silence == 30s);
  CHECK(c.hangs.sections.at("step") == 180s);
  CHECK(c.hangs.idle == 120s);
  ScopedEnv env("PET_HANG_TIMEOUT", "auto");
  CHECK(parse({"/bin/true"}).hangs.learn);
  CHECK(usageError({"--hang-timeout", "step=soon", "/bin/true"}).find("--hang-timeout step: expected a duration") != std::string::npos);
}

TEST_CASE("the etcd backend: --rdzv-backend etcd-v3 takes a member list and the etcd conf keys",
          "[launcher]") {
  auto c = parse({"--nnodes", "1:3", "--rdzv-backend", "etcd-v3", "--rdzv-endpoint",
                  "e1:2379,e2:2379,e3:2379", "--rdzv-conf",
                  "etcd_user=drun,etcd_password_file=/p,etcd_cacert=/ca.pem,etcd_prefix=/x/", "hostname"});
  CHECK(c.rendezvous.backend == drun::rdzv::RendezvousBackend::Etcd);
  CHECK(c.rendezvous.etcdEndpoints == "e1:2379,e2:2379,e3:2379");
  CHECK(c.rendezvous.endpoint.host == "e1");
  auto schemed = parse({"--nnodes", "1:3", "--rdzv-backend", "etcd", "--rdzv-endpoint",
                        "https://[::1]:2379,e2:2379", "hostname"});
  CHECK(schemed.rendezvous.endpoint == drun::HostPort{"::1", 2379});
  CHECK(c.rendezvous.etcdUser == "drun");
  CHECK(c.rendezvous.etcdPasswordFile == "/p");
  CHECK(c.rendezvous.etcdCaFile == "/ca.pem");
  CHECK(c.rendezvous.etcdPrefix == "/x/");
}

TEST_CASE("recovery: --recovery, PET_RECOVERY and recovery_timeout, and the backends they need", "[launcher]") {
  using drun::agent::RecoveryMode;
  CHECK(parse({"hostname"}).recovery.mode == RecoveryMode::Restart);
  CHECK(parse({"hostname"}).recovery.timeout == std::chrono::seconds(30));
  auto c = parse({"--recovery", "in-process", "--rdzv-conf", "recovery_timeout=2500ms", "hostname"});
  CHECK(c.recovery.mode == RecoveryMode::InProcess);
  CHECK(c.recovery.timeout == std::chrono::milliseconds(2500));
  {
    ScopedEnv env("PET_RECOVERY", "in-process");
    CHECK(parse({"hostname"}).recovery.inProcess());
    CHECK(parse({"--recovery", "restart", "hostname"}).recovery.mode == RecoveryMode::Restart);
  }
  // Several nodes: the c10d store is the workers' store.
  CHECK(parse({"--recovery", "in-process", "--nnodes", "2", "--rdzv-endpoint", "h:1", "hostname"})
            .recovery.inProcess());
  CHECK_THAT(usageError({"--recovery", "inprocess", "hostname"}), Catch::Contains("'inprocess'"));
  // standby_workers: unset (by the program's kind) unless given, 0..64.
  CHECK_FALSE(c.recovery.standbyWorkers);
  CHECK(c.recovery.standbys(true) == 1);
  CHECK(c.recovery.standbys(false) == 0);
  CHECK(parse({"hostname"}).recovery.standbys(true) == 0);  // --recovery restart keeps none
  auto two = parse({"--recovery", "in-process", "--rdzv-conf", "standby_workers=2", "hostname"});
  CHECK(two.recovery.standbys(false) == 2);
  CHECK(parse({"--recovery", "in-process", "--rdzv-conf", "standby_workers=0", "hostname"}).recovery.standbys(true) == 0);
  for (const char* bad : {"standby_workers=-1", "standby_workers=65", "standby_workers=one", "standby_workers="})
    CHECK_THAT(usageError({"--rdzv-conf", bad, "hostname"}), Catch::Contains("standby_workers"));
  CHECK_THAT(usageError({"--rdzv-conf", "recovery_timeout=0", "--recovery", "in-process", "hostname"}),
             Catch::Contains("recovery_timeout"));
  CHECK_THAT(usageError({"--recovery", "in-process", "--nnodes", "2", "--node-rank", "0", "hostname"}),
             Catch::Contains("needs --rdzv-backend c10d"));
  CHECK_THAT(usageError({"--recovery", "in-process", "--nnodes", "2", "--rdzv-backend", "etcd",
                         "--rdzv-endpoint", "h:2379", "hostname"}),
             Catch::Contains("--rdzv-backend etcd has no store"));
}

TEST_CASE("torchrun 2.9's placement flags: --numa-binding and --virtual-local-rank", "[launcher]") {
  using drun::agent::NumaMode;
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  CHECK(parse({"hostname"}).numaBinding == NumaMode::Off);
  CHECK_FALSE(parse({"hostname"}).virtualLocalRank);
  CHECK(parse({"--numa-binding", "node", "hostname"}).numaBinding == NumaMode::Node);
  CHECK(parse({"--numa_binding=socket", "hostname"}).numaBinding == NumaMode::Socket);
  CHECK(parse({"--numa-binding", "exclusive", "hostname"}).numaBinding == NumaMode::Exclusive);
  {
    ScopedEnv env("PET_NUMA_BINDING", "core-complex");
    CHECK(parse({"hostname"}).numaBinding == NumaMode::CoreComplex);
  }
  CHECK_THAT(usageError({"--numa-binding", "numa", "hostname"}),
             Catch::Contains("--numa-binding") && Catch::Contains("'numa'"));
  CHECK(parse({"--virtual-local-rank", "hostname"}).virtualLocalRank);
  CHECK(parse({"--virtual_local_rank", "hostname"}).virtualLocalRank);
  {
    ScopedEnv visible("CUDA_VISIBLE_DEVICES", "3,5");
    CHECK(parse({"--virtual-local-rank", "--nproc-per-node", "2", "hostname"}).virtualLocalRank);
    CHECK_THAT(usageError({"--virtual-local-rank", "--nproc-per-node", "3", "hostname"}),
               Catch::Contains("CUDA_VISIBLE_DEVICES='3,5' names 2 device(s) for 3 local ranks"));
    CHECK(parse({"--nproc-per-node", "3", "hostname"}).nprocPerNode == 3);  // without the flag: no check
  }
  // Standby workers start before their local rank is known: none with either flag.
  auto bound = parse({"--recovery", "in-process", "--numa-binding", "node", "python3", "x.py"});
  CHECK(bound.recovery.standbys(true) == 0);
  CHECK(parse({"--recovery", "in-process", "--virtual-local-rank", "hostname"}).recovery.standbys(true) == 0);
  CHECK_THAT(usageError({"--recovery", "in-process", "--rdzv-conf", "standby_workers=1", "--numa-binding",
                         "node", "hostname"}),
             Catch::Contains("standby_workers") && Catch::Contains("--numa-binding"));
}

TEST_CASE("duplicate filters (--duplicate-stdout-filters, --duplicate-stderr-filters) and the health check port", "[launcher]") {
  auto none = parse({"hostname"});
  CHECK(none.output.duplicateStdoutFilters.empty());
  CHECK_FALSE(none.healthCheckPort);
  auto c = parse({"--duplicate-stdout-filters", "loss,acc", "--duplicate_stderr_filters", "Error,,", "hostname"});
  CHECK(c.output.duplicateStdoutFilters == std::vector<std::string>{"loss", "acc"});
  CHECK(c.output.duplicateStderrFilters == std::vector<std::string>{"Error"});
  {
    ScopedEnv port("TORCHELASTIC_HEALTH_CHECK_PORT", "8091");
    CHECK(parse({"hostname"}).healthCheckPort == 8091);
  }
  {
    ScopedEnv port("TORCHELASTIC_HEALTH_CHECK_PORT", "http");
    CHECK_THAT(usageError({"hostname"}), Catch::Contains("TORCHELASTIC_HEALTH_CHECK_PORT"));
  }
  ScopedEnv port("TORCHELASTIC_HEALTH_CHECK_PORT", "65536");
  CHECK_THAT(usageError({"hostname"}), Catch::Contains("TORCHELASTIC_HEALTH_CHECK_PORT"));
}

TEST_CASE("log files' rotation (--log-max-bytes, --log-max-files) and drun's log format (--log-format)",
          "[launcher]") {
  const auto defaults = parse({"/bin/true"});
  CHECK(defaults.output.logRotation.maxBytes == 0);
  CHECK(defaults.output.logRotation.maxFiles == 5);
  const auto sized = parse({"--log-max-bytes", "64K", "--log_max_files", "2", "/bin/true"});
  CHECK(sized.output.logRotation.maxBytes == 65536);
  CHECK(sized.output.logRotation.maxFiles == 2);
  CHECK(parse({"--log-max-bytes", "3G", "/bin/true"}).output.logRotation.maxBytes == (uint64_t{3} << 30));
  CHECK(parse({"--log-max-bytes", "1000", "/bin/true"}).output.logRotation.maxBytes == 1000);
  {
    ScopedEnv env("PET_LOG_MAX_BYTES", "1M");
    CHECK(parse({"/bin/true"}).output.logRotation.maxBytes == (1 << 20));
  }
  for (const char* bad : {"12X", "-1", "K", "", "1.5M", "99999999999999999G"})
    CHECK_THAT(usageError({"--log-max-bytes", bad, "/bin/true"}), Catch::Contains("--log-max-bytes"));
  for (const char* bad : {"-1", "many", "1001"})
    CHECK_THAT(usageError({"--log-max-files", bad, "/bin/true"}), Catch::Contains("--log-max-files"));

  auto withFormat = [](std::vector<std::string> args) {
    args.insert(args.begin(), "drun");
    return parseCommandLine(args).logFormat;
  };
  CHECK_FALSE(withFormat({"/bin/true"}));
  CHECK(withFormat({"--log-format", "json", "/bin/true"}) == std::optional<std::string>("json"));
  CHECK(withFormat({"--log_format", "text", "/bin/true"}) == std::optional<std::string>("text"));
  CHECK_THAT(usageError({"--log-format", "xml", "/bin/true"}),
             Catch::Contains("--log-format: expected text or json, got 'xml'"));
}

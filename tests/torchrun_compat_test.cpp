// A torchrun command line runs unchanged under drun: for each torchrun invocation below, the test
// runs torchrun 1.13 itself (scripts/bench/torchrun_compat.py under /usr/bin/python3) and drun
// with the same arguments, and drun once more with the options in dash spelling and -m as
// --module (torchrun 1.13 knows only the underscore spelling), on a program that records its
// arguments and environment (tests/torch/env_dump.py). Per rank, drun's workers must get every
// variable torchrun sets with the same value, the same arguments, and their lines must reach the
// same places (console, log files). SKIPPED without /usr/bin/python3 and its torch.
//
// "The variables torchrun sets" are found, not listed: those in a torchrun worker's environment
// that the same program started directly (a control run, same environment) does not have or has
// with another value. Values are compared exactly, except where they legitimately differ from
// run to run or between the two implementations; each such normalisation is in valueMismatch()
// with its reason (support/torchrun_compat.hpp). drun may add only kDrunExtras.
//
// Each test case runs on a network-namespace host of its own when namespaces can be made (no
// port of the machine is touched: torchrun --standalone always takes 29400), else on this host.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "netns.hpp"
#include "process.hpp"
#include "torch_python.hpp"
#include "torchrun_compat.hpp"

namespace fs = std::filesystem;
using namespace drun::test;
using namespace drun::test::torchrun_compat;
using namespace std::chrono_literals;

namespace {

constexpr auto kAgentTimeout = 60s;  // hang guard of one launcher run

// The COMPAT lines in `text` (torchrun does not prefix, and its workers' lines may meet
// mid-line: searched, not parsed by line).
std::set<std::string> compatLines(const std::string& text, const std::string& tag) {
  static const std::regex re(R"(COMPAT (hello|oops) rank=(\d+))");
  std::set<std::string> found;
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it)
    found.insert(tag + (*it)[1].str() + " " + (*it)[2].str());
  return found;
}

// Options in dash spelling: --nproc_per_node=2 -> --nproc-per-node=2 (values untouched).
std::vector<std::string> dashed(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (std::string a : args) {
    if (a.rfind("--", 0) == 0) {
      size_t end = std::min(a.find('='), a.size());
      for (size_t i = 2; i < end; ++i)
        if (a[i] == '_') a[i] = '-';
    }
    out.push_back(std::move(a));
  }
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& a : v) s += (s.empty() ? "" : " ") + a;
  return s;
}

// The place the cases run: a namespace host of their own, or this host.
class Host {
 public:
  Host() {
    if (!NetnsCluster::unavailableReason()) cluster_.emplace(1);
  }
  std::vector<std::string> wrap(const std::vector<std::string>& argv) const {
    return cluster_ ? cluster_->exec(0, argv) : argv;
  }
  // A port for c10d endpoints and the static master: any in a private namespace, else a free one.
  int port() const {
    if (cluster_) return 29461;
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port = ntohs(a.sin_port);
    ::close(fd);
    return port;
  }

 private:
  std::optional<NetnsCluster> cluster_;
};

std::vector<std::string> programArgs(Form form) {
  // A space inside an argument, and torchrun's ${local_rank} macro.
  const std::vector<std::string> args = {"plain", "two words", "lr${local_rank}"};
  std::vector<std::string> out;
  switch (form) {
    case Form::Script: out = {torchProgram("env_dump.py").string()}; break;
    case Form::Module: out = {"-m", "env_dump"}; break;
    case Form::NoPython: out = {"--no_python", torchProgram("env_dump.py").string()}; break;
  }
  out.insert(out.end(), args.begin(), args.end());
  return out;
}

// Runs one case under one launcher (nullopt: the control run, the program started directly).
Launch launch(const Host& host, const CompatCase& c, std::optional<Launcher> which,
              const MarkerScope& marker) {
  TempDir dir;
  Launch l;
  fs::path dumps = dir / "dumps";
  l.logDir = dir / "logs";
  l.tmpDir = dir / "tmp";
  fs::create_directories(dumps);
  fs::create_directories(l.tmpDir);
  const std::string port = std::to_string(host.port());

  std::vector<std::string> env = {marker.env(), "COMPAT_DUMP_DIR=" + dumps.string(),
                                  "PYTHONPATH=" + torchProgram("").string(),
                                  std::string("PYTHON_EXEC=") + kTorchPython,
                                  "TMPDIR=" + l.tmpDir.string(), "OMP_NUM_THREADS=1"};
  env.insert(env.end(), c.env.begin(), c.env.end());

  std::vector<std::unique_ptr<Process>> agents;
  for (const auto& options : c.agents) {
    std::vector<std::string> argv;
    if (!which) {
      argv = {kTorchPython, torchProgram("env_dump.py").string()};
    } else {
      std::vector<std::string> line = options;
      // torchrun 1.13 looks at its workers every 5 s by default: that would be most of this
      // test's time. Both launchers get the same 0.1 s (drun accepts and ignores it), except
      // where a case sets it itself.
      if (std::find(line.begin(), line.end(), "--monitor_interval") == line.end())
        line.insert(line.end(), {"--monitor_interval", "0.1"});
      if (*which != Launcher::Torchrun)
        line.insert(line.end(), c.drunOnly.begin(), c.drunOnly.end());
      auto program = programArgs(c.form);
      line.insert(line.end(), program.begin(), program.end());
      for (std::string& s : line) {
        for (auto [from, to] : {std::pair<std::string, std::string>{"{PORT}", port},
                                {"{LOGDIR}", l.logDir.string()}})
          if (auto at = s.find(from); at != std::string::npos) s.replace(at, from.size(), to);
      }
      if (*which == Launcher::DrunDashed) {
        line = dashed(line);
        std::replace(line.begin(), line.end(), std::string("-m"), std::string("--module"));
      }
      if (*which == Launcher::Torchrun) argv = {kTorchPython, torchrunCompat().string()};
      else argv = {drunPath().string()};
      argv.insert(argv.end(), line.begin(), line.end());
    }
    RunOptions o;
    o.argv = host.wrap(argv);
    o.env = env;
    o.timeout = kAgentTimeout;
    agents.push_back(std::make_unique<Process>(std::move(o)));
    if (!which) break;  // one control process
  }
  for (auto& a : agents) l.agents.push_back(a->wait());

  for (const auto& entry : fs::directory_iterator(dumps)) {
    if (entry.path().extension() != ".txt") continue;
    auto parsed = parseEnvDumps(slurp(entry.path()));
    EnvDump d = parsed.count(-1) ? parsed[-1] : EnvDump{};
    // Each launch has a directory of its own (dumps, TMPDIR, log dir): its path is "@" in every
    // value, so that the launches compare (COMPAT_DUMP_DIR=@/dumps everywhere).
    const std::string root = dir.path().string();
    for (auto& [k, v] : d.vars)
      for (auto at = v.find(root); at != std::string::npos; at = v.find(root, at))
        v.replace(at, root.size(), kLaunchDir);
    auto rank = d.get("RANK");
    l.dumps[rank && isCount(*rank) ? std::stoi(*rank) : -1].push_back(std::move(d));
  }
  for (const auto& r : l.agents) {
    for (const auto& s : compatLines(r.out, "stdout ")) l.console.insert(s);
    for (const auto& s : compatLines(r.err, "stderr ")) l.console.insert(s);
  }
  if (fs::exists(l.logDir)) {
    for (const auto& entry : fs::recursive_directory_iterator(l.logDir)) {
      if (!entry.is_regular_file()) continue;
      // Compared from attempt_<n>/ down. Above it each launcher names the run's directory its
      // own way: torchrun <run id>_<random>/ (one per agent), drun <run id>/node<group rank>/
      // (nodes sharing a file system kept apart; docs/options.md, "Files").
      fs::path rel = fs::relative(entry.path(), l.logDir);
      fs::path below;
      bool seen = false;
      for (const auto& part : rel) {
        seen = seen || part.string().rfind("attempt_", 0) == 0;
        if (seen) below /= part;
      }
      for (const auto& s : compatLines(slurp(entry.path()), ""))
        l.files.insert(below.string() + ": " + s);
    }
  }
  l.logDir = fs::path(kLaunchDir) / "logs";  // as the values say it
  l.tmpDir = fs::path(kLaunchDir) / "tmp";
  return l;
}

std::string describe(const Launch& l) {
  std::string s;
  for (size_t i = 0; i < l.agents.size(); ++i)
    s += "--- agent " + std::to_string(i) + ": " + l.agents[i].describe() + "\n";
  return s;
}

// One case: control, torchrun, drun, drun with dashes; every difference is a failed CHECK.
void checkCase(const Host& host, const CompatCase& c) {
  MarkerScope marker;
  INFO("case: " << c.name << "\ntorchrun line: " << joined(c.agents.front()));
  Launch control = launch(host, c, std::nullopt, marker);
  REQUIRE(control.dumps.count(-1) == 1);  // the program alone: no RANK
  const EnvDump& base = control.dumps[-1].front();
  Launch torch = launch(host, c, Launcher::Torchrun, marker);
  INFO("torchrun:\n" << describe(torch));
  for (const auto& r : torch.agents) REQUIRE(r.status() == 0);
  REQUIRE_FALSE(torch.dumps.empty());
  REQUIRE(torch.dumps.count(-1) == 0);

  // What torchrun set: differs from the control run.
  std::set<std::string> setByTorchrun;
  for (const auto& [rank, ds] : torch.dumps)
    for (const auto& [k, v] : ds.front().vars)
      if (base.get(k) != v) setByTorchrun.insert(k);
  for (const char* k : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"})
    REQUIRE(setByTorchrun.count(k) == 1);  // the comparison below sees the essentials

  for (Launcher which : {Launcher::Drun, Launcher::DrunDashed}) {
    Launch drun = launch(host, c, which, marker);
    INFO(launcherName(which) << ":\n" << describe(drun));
    for (const auto& r : drun.agents) CHECK(r.status() == 0);

    std::set<int> torchRanks, drunRanks;
    for (const auto& [rank, ds] : torch.dumps) torchRanks.insert(rank);
    for (const auto& [rank, ds] : drun.dumps) drunRanks.insert(rank);
    CHECK(drunRanks == torchRanks);
    std::map<std::string, std::set<std::string>> perJob;  // values that are one per job
    for (const auto& [rank, ds] : drun.dumps) {
      INFO("RANK " << rank);
      CHECK(ds.size() == 1);  // each rank started once
      if (!torch.dumps.count(rank)) continue;
      const EnvDump& t = torch.dumps.at(rank).front();
      const EnvDump& d = ds.front();
      CHECK(d.args == t.args);
      for (const std::string& key : setByTorchrun) {
        INFO("variable " << key);
        auto tv = t.get(key), dv = d.get(key);
        if (!tv) continue;  // set for some ranks only (none so far)
        if (!dv) {
          FAIL_CHECK("drun does not set " << key << " (torchrun: '" << *tv << "')");
          continue;
        }
        CHECK(valueMismatch(c, key, *tv, *dv, torch, drun, d) == "");
      }
      for (const auto& [k, v] : d.vars) {
        if (base.get(k) == v || setByTorchrun.count(k)) continue;
        INFO("variable " << k << "=" << v << " set by drun only");
        CHECK(kDrunExtras.count(k) == 1);
      }
      for (const auto& [k, v] : base.vars) {  // the user's environment is passed on
        INFO("variable " << k << " of the user's environment");
        if (t.get(k)) CHECK(d.get(k).has_value());
      }
      for (const char* k : {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"})
        perJob[k].insert(d.get(k).value_or(""));
    }
    for (const auto& [k, values] : perJob) {
      INFO(k << " differs between ranks");
      CHECK(values.size() == 1);
    }

    // Where the workers' lines went.
    std::set<std::string> expectConsole = torch.console;
    if (c.consoleLocalRanks) {
      const int nproc = static_cast<int>(torchRanks.size() / c.agents.size());
      std::erase_if(expectConsole, [&](const std::string& s) {
        int rank = std::stoi(s.substr(s.rfind(' ') + 1));
        return c.consoleLocalRanks->count(rank % nproc) == 0;
      });
    }
    CHECK(drun.console == expectConsole);
    // Every file torchrun wrote holds the same lines with drun (drun may write more: with
    // --log-dir it keeps every stream of every rank, docs/options.md).
    for (const auto& f : torch.files) {
      INFO("torchrun's log file line " << f);
      CHECK(drun.files.count(f) == 1);
    }
  }
  CHECK(marker.leftovers(5s).empty());
}

void skipUnlessTorchrun() { skipWithoutTorch("torchrun compatibility test"); }

}  // namespace

// A case with defaults for everything else.
CompatCase line(std::string name, std::vector<std::vector<std::string>> agents) {
  CompatCase c;
  c.name = std::move(name);
  c.agents = std::move(agents);
  return c;
}

template <typename F>
CompatCase with(CompatCase c, F&& change) {
  change(c);
  return c;
}

TEST_CASE("torchrun compat: single-node lines (--standalone, = and space forms, PET_ variables, "
          "--max-restarts, --role, accepted no-ops)", "[torch]") {
  skipUnlessTorchrun();
  Host host;
  const std::vector<CompatCase> cases = {
      line("--standalone --nnodes=1 with restarts, role, monitor interval, start method",
           {{"--standalone", "--nnodes=1", "--nproc_per_node", "3", "--max_restarts", "2", "--role",
             "trainer", "--monitor_interval", "0.5", "--start_method", "fork"}}),
      with(line("options from PET_ variables", {{"--rdzv_id", "from-pet"}}), [](CompatCase& c) {
        c.env = {"PET_STANDALONE=1", "PET_NPROC_PER_NODE=2", "PET_MAX_RESTARTS=1"};
      }),
      with(line("--standalone --nproc_per_node=2, OMP_NUM_THREADS left unset",
                {{"--standalone", "--nproc_per_node=2"}}),
           [](CompatCase& c) { c.env = {"OMP_NUM_THREADS"}; }),
      // torchrun 1.13 replaces the endpoint with its own (localhost:29400); drun warns.
      line("--standalone with an --rdzv_endpoint, which it ignores",
           {{"--standalone", "--nproc_per_node", "2", "--rdzv_endpoint", "127.0.0.1:{PORT}"}}),
  };
  for (const auto& c : cases) checkCase(host, c);
}

TEST_CASE("torchrun compat: rendezvous lines (--nnodes MIN:MAX, --rdzv-backend -endpoint -id "
          "-conf, nproc cpu) and two agents", "[torch]") {
  skipUnlessTorchrun();
  Host host;
  const std::vector<std::string> rdzv = {"--rdzv_backend", "c10d", "--rdzv_endpoint",
                                         "127.0.0.1:{PORT}"};
  std::vector<std::string> elastic = {"--nnodes", "1:2", "--nproc_per_node", "2", "--rdzv_id",
                                      "compat-elastic", "--rdzv_conf",
                                      "join_timeout=30,last_call_timeout=1,close_timeout=10,"
                                      "read_timeout=60"};
  elastic.insert(elastic.end(), rdzv.begin(), rdzv.end());
  std::vector<std::string> two = {"--nnodes=2", "--nproc_per_node=2", "--rdzv_id=compat-two",
                                  "--max_restarts=1"};
  two.insert(two.end(), rdzv.begin(), rdzv.end());
  const std::vector<CompatCase> cases = {
      line("--nnodes 1:2 with c10d endpoint, id and conf", {elastic}),
      // No --rdzv_id (run id "none"), the endpoint by name, a worker per CPU.
      line("--nnodes=1:1 --nproc_per_node=cpu, endpoint localhost, no id",
           {{"--nnodes=1:1", "--nproc_per_node=cpu", "--rdzv_backend=c10d",
             "--rdzv_endpoint=localhost:{PORT}"}}),
      line("two agents of --nnodes=2 on one host", {two, two}),
  };
  for (const auto& c : cases) checkCase(host, c);
}

TEST_CASE("torchrun compat: program forms (script with arguments, -m or --module, --no-python)",
          "[torch]") {
  skipUnlessTorchrun();
  Host host;
  const std::vector<std::string> options = {"--standalone", "--nproc_per_node", "2"};
  auto form = [&](const char* name, Form f) {
    return with(line(name, {options}), [f](CompatCase& c) { c.form = f; });
  };
  const std::vector<CompatCase> cases = {form("-m MODULE (drun: --module too)", Form::Module),
                                         form("--no_python EXECUTABLE", Form::NoPython)};
  for (const auto& c : cases) checkCase(host, c);
}

TEST_CASE("torchrun compat: output options (-r, --log-dir with -r, per-rank --redirects and "
          "--tee, --local-ranks-filter)", "[torch]") {
  skipUnlessTorchrun();
  Host host;
  auto logged = [](const char* name, std::vector<std::string> extra) {
    std::vector<std::string> options = {"--standalone", "--nproc_per_node", "2", "--log_dir",
                                        "{LOGDIR}"};
    options.insert(options.end(), extra.begin(), extra.end());
    return with(line(name, {options}), [](CompatCase& c) { c.logDir = true; });
  };
  const std::vector<CompatCase> cases = {
      line("-r 3 without --log_dir (a temporary one)",
           {{"--standalone", "--nproc_per_node", "2", "-r", "3"}}),
      logged("--log_dir -r 3", {"-r", "3"}),
      // torchrun 1.13 has no --local-ranks-filter (2.2 has): drun alone gets it, and its console
      // shows what torchrun's shows of local rank 0 (redirected and tee'd: the subtle one).
      with(logged("--log_dir --redirects 0:1,1:2 --tee 0:3 (drun: --local-ranks-filter 0)",
                  {"--redirects", "0:1,1:2", "--tee", "0:3"}),
           [](CompatCase& c) {
             c.drunOnly = {"--local-ranks-filter", "0"};
             c.consoleLocalRanks = std::set<int>{0};
           }),
  };
  for (const auto& c : cases) checkCase(host, c);
}

// The classic static line (no --rdzv-backend: torchrun's default static backend, node 0's agent
// serving the store at --master_addr:--master_port). Depends on the static semantics the lead is
// giving this line in the CLI: until then drun rejects it (--nnodes 2 needs --rdzv-endpoint).
TEST_CASE("torchrun compat: the classic static line --nnodes=2 --node_rank --master_addr "
          "--master_port", "[torch]") {
  skipUnlessTorchrun();
  Host host;
  auto node = [](int rank) {
    return std::vector<std::string>{"--nnodes=2", "--node_rank=" + std::to_string(rank),
                                    "--master_addr=127.0.0.1", "--master_port={PORT}",
                                    "--nproc_per_node=2"};
  };
  checkCase(host, with(line("classic static line on two agents", {node(0), node(1)}),
                       [](CompatCase& c) { c.staticBackend = true; }));
}

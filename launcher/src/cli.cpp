#include "drun/launcher/cli.hpp"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "drun/common/env.hpp"
#include "drun/common/host_port.hpp"
#include "drun/launcher/program.hpp"
#include "drun/launcher/slurm_env.hpp"
#include "drun/rendezvous/keys.hpp"

namespace drun::launch {
namespace {

using agent::AgentConfig;
using agent::StdRouting;

// "--nproc-per-node,--nproc_per_node": torchrun accepts both spellings.
std::string spellings(const std::string& dashed) {
  std::string underscored = dashed;
  for (char& c : underscored)
    if (c == '-') c = '_';
  return underscored == dashed ? "--" + dashed : "--" + dashed + ",--" + underscored;
}

// PET_NPROC_PER_NODE for "nproc-per-node", as torchrun's argparse `env` action.
std::string petName(const std::string& dashed) {
  std::string out = "PET_";
  for (char c : dashed) out += c == '-' ? '_' : static_cast<char>(std::toupper(c));
  return out;
}

// Wraps env::parse* so that their InvalidArgument becomes a usage error naming the option.
template <typename F>
auto usage(F&& f) {
  try {
    return f();
  } catch (const UsageError&) {
    throw;
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
}

int countCpus() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
}

int countGpus() {
  // NVIDIA's driver lists one directory per GPU; no CUDA runtime needed to count them.
  std::error_code ec;
  int n = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec))
    if (entry.is_directory()) ++n;
  return n;
}

int parseNproc(const std::string& text) {
  if (text == "cpu") return countCpus();
  if (text == "gpu") {
    int gpus = countGpus();
    if (gpus == 0) throw UsageError("--nproc-per-node gpu: no GPU found on this host");
    return gpus;
  }
  if (text == "auto") {
    int gpus = countGpus();
    return gpus > 0 ? gpus : countCpus();
  }
  return static_cast<int>(usage([&] {
    return env::parseInt(text, "--nproc-per-node (a positive count, auto, cpu or gpu)", 1, 4096);
  }));
}

// The rendezvous closes a round with one multi_set of MAX + 3 keys: the store's per-request key
// limit (65536) bounds MAX.
constexpr int kMaxNodes = 65000;

std::pair<int, int> parseNnodes(const std::string& text) {
  auto colon = text.find(':');
  const char* what = "--nnodes (N or MIN:MAX, 1 <= MIN <= MAX <= 65000)";
  if (colon == std::string::npos) {
    int n = static_cast<int>(usage([&] { return env::parseInt(text, what, 1, kMaxNodes); }));
    return {n, n};
  }
  int lo = static_cast<int>(usage([&] { return env::parseInt(text.substr(0, colon), what, 1, kMaxNodes); }));
  int hi = static_cast<int>(usage([&] { return env::parseInt(text.substr(colon + 1), what, 1, kMaxNodes); }));
  if (lo > hi) throw UsageError(std::string(what) + ": MIN " + std::to_string(lo) + " > MAX " + std::to_string(hi));
  return {lo, hi};
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, sep)) out.push_back(item);
  if (!text.empty() && text.back() == sep) out.push_back("");
  return out;
}

// torchrun's --redirects/--tee: "3" for every rank, or "0:1,2:3" per local rank. The two options
// combine per local rank whichever form each has (-r 0:1 -t 3: rank 0's stdout redirected, every
// rank tee'd), so a single value reaches the per-rank entries the other option made, and a new
// entry starts from the single value of the other.
void parseStdSpec(const std::string& text, const char* option, int nproc,
                  int StdRouting::*field, agent::OutputOptions& out) {
  std::string what = std::string(option) + " (0-3, or LOCAL_RANK:0-3,... e.g. 0:1,1:2)";
  if (text.find(':') == std::string::npos) {
    out.defaultRouting.*field = static_cast<int>(usage([&] { return env::parseInt(text, what, 0, 3); }));
    for (auto& [rank, routing] : out.routing) routing.*field = out.defaultRouting.*field;
    return;
  }
  for (const std::string& pair : split(text, ',')) {
    auto colon = pair.find(':');
    if (colon == std::string::npos) throw UsageError(what + ": '" + pair + "' is not LOCAL_RANK:VALUE");
    int rank = static_cast<int>(usage([&] { return env::parseInt(pair.substr(0, colon), what, 0, nproc - 1); }));
    int value = static_cast<int>(usage([&] { return env::parseInt(pair.substr(colon + 1), what, 0, 3); }));
    out.routing.try_emplace(rank, out.defaultRouting).first->second.*field = value;
  }
}

std::vector<int> parseRankList(const std::string& text, int nproc) {
  std::string what = "--local-ranks-filter (comma-separated local ranks, e.g. 0,2)";
  std::set<int> ranks;
  for (const std::string& item : split(text, ','))
    ranks.insert(static_cast<int>(usage([&] { return env::parseInt(item, what, 0, nproc - 1); })));
  if (ranks.empty()) throw UsageError(what + ": empty");
  return {ranks.begin(), ranks.end()};
}


std::string durationText(std::chrono::milliseconds d) {
  return d.count() % 1000 == 0 ? std::to_string(d.count() / 1000) + "s" : std::to_string(d.count()) + "ms";
}

// The --rdzv-conf keys, one table: parsing, the error for an unknown key and --help use it.
struct ConfKey {
  const char* name;
  const char* doc;
  std::chrono::milliseconds rdzv::RendezvousOptions::*duration;  // null: not a duration
  std::string rdzv::RendezvousOptions::*path = nullptr;          // a file name
};
const ConfKey kConfKeys[] = {
    {"join_timeout", "how long a node waits for the job to form (alias: timeout)",
     &rdzv::RendezvousOptions::joinTimeout},
    {"last_call_timeout", "wait for more nodes once MIN joined", &rdzv::RendezvousOptions::lastCallTimeout},
    {"close_timeout", "the store's host waits this long for the others to leave",
     &rdzv::RendezvousOptions::closeTimeout},
    {"replace_timeout", "after losing nodes below MIN, wait this long for replacements (0: fail "
     "at once; under SLURM 0 unless given)", &rdzv::RendezvousOptions::replaceTimeout},
    {"reconnect_timeout", "a lost store (restarted, a cut link) is retried this long; a restarted "
     "store is refilled by the survivors (the restart count goes on)",
     &rdzv::RendezvousOptions::reconnectTimeout},
    {"heartbeat_interval", "store keep-alive (alias: keep_alive_interval)",
     &rdzv::RendezvousOptions::heartbeatInterval},
    {"heartbeat_timeout", "a node silent this long is lost; a cut node fences itself within it",
     &rdzv::RendezvousOptions::heartbeatTimeout},
    {"read_timeout", "deadline of one store call", &rdzv::RendezvousOptions::readTimeout},
    {"progress_interval", "a waiting node says so at this pace (the first line after 1s)",
     &rdzv::RendezvousOptions::progressInterval},
    {"is_host", "this node hosts the store (default: when the endpoint is one of its addresses)", nullptr},
    {"token_file", "the store's shared secret, a file of mode 600 (also DRUN_RDZV_TOKEN_FILE)",
     nullptr, &rdzv::RendezvousOptions::tokenFile},
    {"etcd_user", "etcd backend: the user to authenticate as (needs etcd_password_file)", nullptr,
     &rdzv::RendezvousOptions::etcdUser},
    {"etcd_password_file", "etcd backend: a file of mode 600 whose first line is the password",
     nullptr, &rdzv::RendezvousOptions::etcdPasswordFile},
    {"etcd_cacert", "etcd backend: https, the members' certificates checked against this CA file",
     nullptr, &rdzv::RendezvousOptions::etcdCaFile},
    {"etcd_prefix", "etcd backend: every key drun writes is under it (default /drun/)", nullptr,
     &rdzv::RendezvousOptions::etcdPrefix},
};

std::string confKeysHelp() {
  const rdzv::RendezvousOptions defaults;
  std::string out;
  for (const ConfKey& key : kConfKeys) {
    std::string line = std::string("  ") + key.name;
    if (key.duration)
      line += "=DURATION (" +
              (defaults.*key.duration < std::chrono::milliseconds(0) ? std::string("join_timeout")
                                                                     : durationText(defaults.*key.duration)) +
              ")";
    else if (key.path) line += "=PATH";
    else line += "=BOOL";
    line.resize(std::max<size_t>(line.size() + 1, 36), ' ');
    out += line + key.doc + "\n";
  }
  return out;
}

void parseRdzvConf(const std::string& text, rdzv::RendezvousOptions& out) {
  for (const std::string& item : split(text, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos) throw UsageError("--rdzv-conf: '" + item + "' is not key=value");
    std::string key = item.substr(0, eq);
    std::string value = item.substr(eq + 1);
    std::string what = "--rdzv-conf " + key;
    if (key == "timeout") key = "join_timeout";  // torchrun's legacy spelling
    if (key == "keep_alive_interval") key = "heartbeat_interval";
    if (key == "store_type" && value == "tcp") continue;
    if (key == "is_host") {
      out.isHost = usage([&] { return env::parseBool(value, what); });
      continue;
    }
    const ConfKey* known = nullptr;
    for (const ConfKey& k : kConfKeys)
      if (key == k.name && (k.duration || k.path)) known = &k;
    if (!known) {
      std::string names;
      for (const ConfKey& k : kConfKeys) names += (names.empty() ? "" : ", ") + std::string(k.name);
      throw UsageError("--rdzv-conf: unknown key '" + key + "' (known: " + names + ")");
    }
    if (known->path) {
      if (value.empty()) throw UsageError(what + ": needs a file name");
      out.*(known->path) = value;
      continue;
    }
    out.*(known->duration) = usage([&] { return env::parseDuration(value, what); });
  }
}

// 128 random bits as 32 hex digits (each 32-bit part zero-padded: the length never varies).
std::string randomRunId() {
  std::random_device rd;
  char buf[33];
  std::snprintf(buf, sizeof buf, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  return buf;
}

// The console prefix macros (output_mux expands them): anything else in ${...} is a typo.
void validatePrefix(const std::string& tmpl) {
  static const char* const kMacros[] = {"rank", "local_rank", "role_name", "hostname"};
  for (size_t at = tmpl.find("${"); at != std::string::npos; at = tmpl.find("${", at + 2)) {
    const size_t close = tmpl.find('}', at);
    if (close == std::string::npos)
      throw UsageError("--prefix: unterminated '${' in '" + tmpl + "'");
    const std::string name = tmpl.substr(at + 2, close - at - 2);
    if (std::none_of(std::begin(kMacros), std::end(kMacros), [&](const char* m) { return name == m; }))
      throw UsageError("--prefix: unknown macro '${" + name + "}' (known: ${rank}, ${local_rank}, "
                       "${role_name}, ${hostname})");
  }
}

std::string thisHostname() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

// --tty auto|always|never, --stdin RANK|none.
void parseTerminalOptions(const std::string& tty, const std::string& stdinRank, agent::OutputOptions& out) {
  if (tty == "auto") out.tty = agent::TtyMode::Auto;
  else if (tty == "always") out.tty = agent::TtyMode::Always;
  else if (tty == "never") out.tty = agent::TtyMode::Never;
  else throw UsageError("--tty: expected auto, always or never, got '" + tty + "'");
  if (stdinRank == "none") out.stdinRank.reset();
  else out.stdinRank = static_cast<int>(usage([&] { return env::parseInt(stdinRank, "--stdin (a global rank >= 0, or none)", 0, 1 << 30); }));
}

// --signals-to-handle: torchrun's comma-separated names (SIGUSR1, or USR1, or a number). Only
// signals that mean "end the job" make sense; job control, faults and SIGKILL/SIGSTOP do not.
std::vector<int> parseSignals(const std::string& text) {
  static const std::pair<const char*, int> kAllowed[] = {
      {"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT},     {"TERM", SIGTERM},
      {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"ALRM", SIGALRM},     {"XCPU", SIGXCPU},
      {"XFSZ", SIGXFSZ}, {"PWR", SIGPWR},   {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF}};
  std::vector<int> out;
  for (std::string item : split(text, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    std::string name = item;
    for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (name.rfind("SIG", 0) == 0) name.erase(0, 3);
    int number = 0;
    for (const auto& [known, sig] : kAllowed)
      if (name == known || name == std::to_string(sig)) number = sig;
    if (number == 0) {
      std::string names;
      for (const auto& [known, sig] : kAllowed) names += (names.empty() ? "SIG" : ", SIG") + std::string(known);
      throw UsageError("--signals-to-handle: '" + item + "' is not a signal drun can forward (one of " +
                       names + ")");
    }
    if (std::find(out.begin(), out.end(), number) == out.end()) out.push_back(number);
  }
  return out;
}

// --log-dir must be a directory, or name one drun can create: a file on the way is a usage
// error (not a raw filesystem error once the job starts).
void checkLogDir(const std::filesystem::path& dir) {
  std::error_code ec;
  for (std::filesystem::path p = dir; !p.empty(); p = p.parent_path()) {
    auto status = std::filesystem::status(p, ec);
    if (std::filesystem::exists(status)) {
      if (!std::filesystem::is_directory(status))
        throw UsageError("--log-dir " + dir.string() + ": " +
                         (p == dir ? "is a file, not a directory" : p.string() + " is a file, not a directory"));
      return;
    }
    if (p == p.parent_path()) return;
  }
}

}  // namespace

void parseRendezvousConf(const std::string& text, rdzv::RendezvousOptions& out) { parseRdzvConf(text, out); }

// HOST, HOST:PORT, [V6], [V6]:PORT (HostPort's rules); a missing port keeps out's.
void parseEndpoint(const std::string& text, rdzv::RendezvousOptions& out) {
  out.endpoint = usage([&] {
    return HostPort::parse(text, {"--rdzv-endpoint", out.endpoint.port, /*minPort=*/0});
  });
}

CliResult parseCommandLine(const std::vector<std::string>& args) {
  CLI::App app{"drun: launch a distributed job (torchrun-compatible options)", "drun"};
  app.prefix_command();  // PROGRAM and everything after it belong to the workers
  app.set_help_flag("-h,--help", "print this help and exit");
  app.set_version_flag("--version", "drun 0.1.0", "print the version and exit");
  app.get_formatter()->column_width(44);
  // An option given twice: the last one wins, as with torchrun's argparse.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  std::string nproc = "1", nnodes = "1", maxRestarts = "0", monitorInterval = "0.1", role = "default";
  std::string shutdownTimeout = "30", redirects = "0", tee = "0", localRanksFilter, logDir;
  std::string rdzvBackend = "c10d", rdzvEndpoint, rdzvId = "none", rdzvConf, nodeRank, masterAddr,
              masterPort, localAddr, startMethod = "spawn", logLevel;
  std::optional<std::string> prefix;
  bool standalone = false, module = false, noPython = false, runPath = false, verbose = false;
  bool noSlurm = false;

  // Every option: both spellings, a value name, PET_<NAME> from the environment.
  auto opt = [&](const std::string& name, std::string& target, const std::string& valueName,
                 const std::string& help) {
    return app.add_option(spellings(name), target, help)->envname(petName(name))->type_name(valueName);
  };
  auto flag = [&](const std::string& names, const std::string& pet, bool& target, const std::string& help) {
    auto* f = app.add_flag(names, target, help);
    if (!pet.empty()) f->envname(pet);
    return f;
  };

  opt("nproc-per-node", nproc, "N|auto|cpu|gpu", "workers on this node (default 1)");
  auto* nnodesOption = opt("nnodes", nnodes, "N|MIN:MAX", "number of nodes, or an elastic range (default 1)");
  flag(spellings("standalone"), "PET_STANDALONE", standalone, "single-node job with a private rendezvous and run id");
  opt("max-restarts", maxRestarts, "N", "restarts of the whole job before it fails (default 0)");
  opt("monitor-interval", monitorInterval, "SECONDS", "accepted for torchrun compatibility; drun reacts to events");
  opt("role", role, "NAME", "worker role name, ROLE_NAME (default 'default')");
  opt("shutdown-timeout", shutdownTimeout, "DURATION", "SIGTERM to SIGKILL grace when stopping workers (default 30s)");
  opt("log-dir", logDir, "DIR", "per-rank files under DIR/<run>/node<N>/attempt_<n>/<local_rank>/ (default none)");
  app.add_option("-r,--redirects", redirects, "streams to log files only, for all or per local rank (default 0)")
      ->envname("PET_REDIRECTS")->type_name("0-3|R:0-3,...");
  app.add_option("-t,--tee", tee, "streams copied to log files too, for all or per local rank (default 0)")
      ->envname("PET_TEE")->type_name("0-3|R:0-3,...");
  opt("local-ranks-filter", localRanksFilter, "R,R,...", "only these local ranks reach the console (default all)");
  app.add_option(spellings("prefix"), prefix,
                 "console line prefix, macros ${rank} ${local_rank} ${role_name} ${hostname}; "
                 "'' = none (default '[${rank}]:' with more than one worker)")
      ->envname("PET_PREFIX")->type_name("TEMPLATE");
  flag("-m,--module", "PET_MODULE", module, "run PROGRAM as a Python module (python -m)");
  flag(spellings("no-python"), "PET_NO_PYTHON", noPython, "exec PROGRAM as given, even a .py file");
  flag(spellings("run-path"), "PET_RUN_PATH", runPath, "rejected: drun starts every worker as its own process");
  opt("start-method", startMethod, "spawn|fork|forkserver", "accepted for torchrun compatibility");
  auto* backendOption = opt("rdzv-backend", rdzvBackend, "c10d|etcd|static",
                            "rendezvous backend (default c10d; static when --nnodes > 1 comes without "
                            "--rdzv-endpoint, as torchrun's default)");
  opt("rdzv-endpoint", rdzvEndpoint, "HOST[:PORT]", "the rendezvous store (default port 29400)");
  opt("rdzv-id", rdzvId, "ID", "job id shared by every node, TORCHELASTIC_RUN_ID (default none)");
  opt("rdzv-conf", rdzvConf, "KEY=VALUE,...", "rendezvous settings: see the keys below");
  opt("node-rank", nodeRank, "N", "this node's rank (static: required; c10d: honoured when given)");
  auto* masterAddrOption = opt("master-addr", masterAddr, "HOST", "static backend: MASTER_ADDR (default 127.0.0.1)");
  auto* masterPortOption = opt("master-port", masterPort, "PORT", "static backend: MASTER_PORT (default 29500)");
  opt("local-addr", localAddr, "ADDR", "this node's address as the other nodes reach it (default: the route to the endpoint)");
  flag(spellings("no-slurm"), "", noSlurm,
       "ignore SLURM_* (by default an srun step fills --nnodes, --node-rank, --rdzv-endpoint, --rdzv-id)");
  flag("-v,--verbose", "", verbose, "debug logging (same as DRUN_LOG_LEVEL=debug)");
  app.add_option(spellings("log-level"), logLevel, "drun's own log level (default warn; DRUN_LOG_LEVEL)")
      ->type_name("trace|debug|info|warn|error|off");
  // The user's terminal (agent/README.md "The terminal"): ptys for the workers, stdin to a rank.
  // Hangs (README "Hangs"): off unless given.
  std::string hangTimeout, hangIdle;
  opt("hang-timeout", hangTimeout, "SECONDS|NAME=SECONDS,...|auto",
      "a rank silent that long (drun.worker heartbeats), or in a section past its timeout, is hung: "
      "its stack is taken and the job restarts; auto: learned (default off)");
  opt("hang-idle", hangIdle, "SECONDS",
      "zero-code: a rank with no CPU time and no output that long, while another rank finished or "
      "idles too, is hung (default off)");
  std::string eventsPath = env::getString("DRUN_EVENTS");
  app.add_option("--events", eventsPath,
                 "the job's events, one JSON object per line, appended to PATH; - = stderr "
                 "(README \"Watching a job\"; default DRUN_EVENTS)")
      ->type_name("PATH|-");
  std::string tty = "auto", stdinRank = "0";
  std::string signalsToHandle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  opt("signals-to-handle", signalsToHandle, "SIG,SIG,...",
      "signals forwarded to the workers that end the job like SIGTERM, e.g. SIGUSR1 for SLURM's "
      "preemption notice (default SIGTERM,SIGINT,SIGHUP,SIGQUIT, always handled)");
  opt("tty", tty, "auto|always|never", "worker stdout/stderr on pseudo-terminals of their own (default auto: where drun's are terminals)");
  opt("stdin", stdinRank, "RANK|none", "the global rank that reads drun's stdin (default 0); none: every worker reads /dev/null");

  std::string footer =
      "\nUsage: drun [OPTIONS] PROGRAM [ARGS...]   or   drun [OPTIONS] -m MODULE [ARGS...]\n"
      "       drun status --rdzv-endpoint HOST[:PORT] [--rdzv-id ID] [--json]   (the jobs on a store)\n"
      "PROGRAM: any executable; a .py file runs under the Python interpreter.\n\n"
      "--rdzv-conf keys (DURATION: 30, 30s, 500ms, 2m; a bare number is seconds):\n" +
      confKeysHelp() +
      "\nEnvironment:\n"
      "  PET_<OPTION>                      any option above, e.g. PET_NPROC_PER_NODE=4 (the command line wins)\n"
      "  PYTHON_EXEC                       the interpreter for .py programs and -m (as torchrun)\n";
  for (const env::VarDoc& v : env::drunVariables()) {
    std::string line = "  " + std::string(v.name);
    line.resize(std::max<size_t>(line.size() + 1, 36), ' ');
    footer += line + std::string(v.doc) +
              (v.defaultValue.empty() ? "" : " (default " + std::string(v.defaultValue) + ")") + "\n";
  }
  app.footer(footer);

  std::vector<std::string> reversed(args.rbegin(), args.rend() - 1);
  CliResult result;
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    result.printAndExit = app.help();
    return result;
  } catch (const CLI::CallForVersion&) {
    result.printAndExit = "drun 0.1.0\n";
    return result;
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }

  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
  else if (!rest.empty() && rest.front().size() > 1 && rest.front().front() == '-')
    throw UsageError("unknown option '" + rest.front() + "' (see drun --help)");

  if (runPath)
    throw UsageError("--run-path is not supported: drun starts each worker as its own process; "
                     "run the script directly (drun script.py) instead");
  if (!startMethod.empty() && startMethod != "spawn" && startMethod != "fork" && startMethod != "forkserver")
    throw UsageError("--start-method: expected spawn, fork or forkserver, got '" + startMethod + "'");
  usage([&] { return env::parseDuration(monitorInterval, "--monitor-interval"); });

  // ---- SLURM hook (launcher/src/slurm_env.cpp): under an srun step, each option given neither
  // on the command line nor by PET_* (CLI11's count() counts both) takes the step's value.
  std::optional<bool> slurmIsHost;
  if (!noSlurm && !standalone) {
    const EnvMap env = currentEnvironment();
    if (auto warning = slurmOutsideStepWarning(env)) result.warnings.push_back(*warning);
    if (auto step = detectSlurmStep(env)) {
      const std::map<std::string, std::string*> targets = {
          {"nnodes", &nnodes}, {"node-rank", &nodeRank}, {"rdzv-endpoint", &rdzvEndpoint}, {"rdzv-id", &rdzvId}};
      SlurmFill fill = slurmFill(*step, [&](const std::string& name) { return app.get_option("--" + name)->count() > 0; });
      for (const auto& [name, value] : fill.options) *targets.at(name) = value;
      slurmIsHost = fill.isHost;
      result.notes.push_back(fill.describe(*step));
    }
  }
  // ---- end of the SLURM hook

  AgentConfig& c = result.config;
  c.nprocPerNode = parseNproc(nproc);
  auto [minNodes, maxNodes] = parseNnodes(nnodes);
  c.rendezvous.maxRestarts = static_cast<int>(usage([&] { return env::parseInt(maxRestarts, "--max-restarts (a count >= 0)", 0, 1000000); }));
  c.shutdownTimeout = usage([&] { return env::parseDuration(shutdownTimeout, "--shutdown-timeout"); });
  if (role.empty()) throw UsageError("--role: the role name is empty");
  c.role = role;
  c.hostname = thisHostname();

  rdzv::RendezvousOptions& r = c.rendezvous;
  r.minNodes = minNodes;
  r.maxNodes = maxNodes;
  r.localWorldSize = c.nprocPerNode;
  const auto backend = rdzv::parseRendezvousBackend(rdzvBackend);
  if (!backend)
    throw UsageError("--rdzv-backend: '" + rdzvBackend + "' is not supported (use c10d, etcd or static)");
  r.backend = *backend;
  r.runId = rdzvId.empty() ? "none" : rdzvId;
  usage([&] { rdzv::keys::validateRunId(r.runId); return 0; });  // it names directories too
  if (standalone && !rdzvEndpoint.empty()) {
    // torchrun warns and ignores it: --standalone means a private rendezvous on this host.
    result.warnings.push_back("--standalone ignores --rdzv-endpoint " + rdzvEndpoint +
                              " (a standalone job has its own rendezvous)");
    rdzvEndpoint.clear();
  }
  if (!rdzvEndpoint.empty() && r.backend == rdzv::RendezvousBackend::Etcd) {
    // A member list: h1:2379,h2:2379,h3:2379 (each checked by the etcd client at the start).
    r.etcdEndpoints = rdzvEndpoint;
    std::string first = rdzvEndpoint.substr(0, rdzvEndpoint.find(','));
    for (const char* scheme : {"http://", "https://"})  // etcdctl's spelling, as the client takes it
      if (first.starts_with(scheme)) first.erase(0, std::strlen(scheme));
    parseEndpoint(first, r);
  } else if (!rdzvEndpoint.empty()) {
    parseEndpoint(rdzvEndpoint, r);
  }
  parseRdzvConf(rdzvConf, r);
  if (!r.isHost) r.isHost = slurmIsHost;  // SLURM hook: the step's first node hosts the store
  // SLURM replaces nothing inside a running step (a requeue starts a new one): survivors that
  // waited for a replacement would wait for nobody.
  if (slurmIsHost && r.replaceTimeout < std::chrono::milliseconds(0))
    r.replaceTimeout = std::chrono::milliseconds(0);
  if (!nodeRank.empty()) {
    // A copy: clang 14 (the fuzz build's compiler) cannot capture a structured binding.
    const int lastRank = maxNodes - 1;
    r.nodeRank = static_cast<int>(usage([&] { return env::parseInt(nodeRank, "--node-rank", 0, lastRank); }));
  }
  r.masterAddr = masterAddr;
  if (!masterPort.empty())
    r.masterPort = static_cast<uint16_t>(usage([&] { return env::parseInt(masterPort, "--master-port", 1, 65535); }));
  r.localAddr = localAddr;
  if (standalone) {
    if (maxNodes > 1) throw UsageError("--standalone runs a single node; it conflicts with --nnodes " + nnodes);
    if (r.runId == "none") r.runId = randomRunId();
  }
  // torchrun's default backend is static: its classic multi-node line (--nnodes, --node-rank,
  // --master-addr, --master-port, no endpoint) means a static job. drun's default stays c10d
  // whenever there is an endpoint to meet at.
  if (backendOption->count() == 0 && maxNodes > 1 && r.endpoint.host.empty()) r.backend = rdzv::RendezvousBackend::Static;
  if (r.backend == rdzv::RendezvousBackend::C10d && (masterAddrOption->count() || masterPortOption->count()) && maxNodes > 1)
    result.warnings.push_back("--master-addr/--master-port are for the static backend; the c10d "
                              "rendezvous picks MASTER_ADDR/MASTER_PORT itself");
  if (r.backend == rdzv::RendezvousBackend::Etcd && r.etcdEndpoints.empty())
    throw UsageError("--rdzv-backend etcd needs --rdzv-endpoint HOST:PORT[,HOST:PORT...] (the etcd members)");
  const rdzv::BackendCapabilities can = rdzv::capabilities(r.backend);
  if (maxNodes > 1 && can.needsEndpoint && r.endpoint.host.empty())
    throw UsageError("--nnodes " + nnodes + " with --rdzv-backend " + toString(r.backend) + " needs --rdzv-endpoint HOST[:PORT] "
                     "(the node hosting the rendezvous)");
  if (!can.elastic && minNodes != maxNodes)
    throw UsageError("--rdzv-backend " + std::string(toString(r.backend)) + " needs a fixed --nnodes, got " + nnodes +
                     (nnodesOption->count() && backendOption->count() == 0
                          ? " (an elastic range needs --rdzv-endpoint HOST[:PORT])"
                          : ""));

  if (r.backend == rdzv::RendezvousBackend::Static && maxNodes > 1 && !r.nodeRank)
    throw UsageError("--nnodes " + nnodes + " with the static rendezvous needs --node-rank "
                     "(or give --rdzv-endpoint HOST[:PORT] for the c10d rendezvous)");
  parseStdSpec(redirects, "--redirects", c.nprocPerNode, &StdRouting::redirect, c.output);
  parseStdSpec(tee, "--tee", c.nprocPerNode, &StdRouting::tee, c.output);
  if (!localRanksFilter.empty()) c.output.consoleLocalRanks = parseRankList(localRanksFilter, c.nprocPerNode);
  if (!logDir.empty()) {
    checkLogDir(logDir);
    c.logDir = std::filesystem::path(logDir);
  }
  c.signalsToHandle = parseSignals(signalsToHandle);
  if (prefix) validatePrefix(*prefix);
  c.prefixTemplate = prefix;
  c.output.roleName = c.role;
  c.output.hostname = c.hostname;
  parseTerminalOptions(tty, stdinRank, c.output);
  if (!hangTimeout.empty()) usage([&] { agent::parseHangTimeout(hangTimeout, c.hangs); return 0; });
  if (!hangIdle.empty()) usage([&] { agent::parseHangIdle(hangIdle, c.hangs); return 0; });
  c.eventsPath = eventsPath;
  if (!eventsPath.empty() && eventsPath != "-") {  // said now, before anything is set up
    std::FILE* f = std::fopen(eventsPath.c_str(), "a");
    if (!f) throw UsageError("--events " + eventsPath + ": cannot open it: " + std::strerror(errno));
    std::fclose(f);
  }
  c.jobHistory = usage([] { return env::getBool("DRUN_JOB_HISTORY"); });

  ResolvedProgram program = resolveProgram({rest, module, noPython});
  c.program = std::move(program.argv);
  c.isPython = program.isPython;
  c.interpreter = std::move(program.interpreter);

  if (verbose) result.logLevel = "debug";
  if (!logLevel.empty()) result.logLevel = logLevel;
  return result;
}

}  // namespace drun::launch

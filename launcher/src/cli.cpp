#include "drun/launcher/cli.hpp"

#include <sched.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "drun/common/env.hpp"
#include "drun/launcher/program.hpp"

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

// torchrun's --redirects/--tee: "3" for every rank, or "0:1,2:3" per local rank.
void parseStdSpec(const std::string& text, const char* option, int nproc,
                  int StdRouting::*field, agent::OutputOptions& out) {
  std::string what = std::string(option) + " (0-3, or LOCAL_RANK:0-3,... e.g. 0:1,1:2)";
  if (text.find(':') == std::string::npos) {
    out.defaultRouting.*field = static_cast<int>(usage([&] { return env::parseInt(text, what, 0, 3); }));
    return;
  }
  for (const std::string& pair : split(text, ',')) {
    auto colon = pair.find(':');
    if (colon == std::string::npos) throw UsageError(what + ": '" + pair + "' is not LOCAL_RANK:VALUE");
    int rank = static_cast<int>(usage([&] { return env::parseInt(pair.substr(0, colon), what, 0, nproc - 1); }));
    int value = static_cast<int>(usage([&] { return env::parseInt(pair.substr(colon + 1), what, 0, 3); }));
    out.routing[rank].*field = value;
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

// HOST, HOST:PORT, [V6]:PORT.
void parseEndpoint(const std::string& text, rdzv::RendezvousOptions& out) {
  std::string host = text;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string::npos) throw UsageError("--rdzv-endpoint: unbalanced '[' in '" + text + "'");
    host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') throw UsageError("--rdzv-endpoint: expected ':' after ']' in '" + text + "'");
      port = text.substr(close + 2);
    }
  } else if (auto colon = text.rfind(':'); colon != std::string::npos && text.find(':') == colon) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty()) throw UsageError("--rdzv-endpoint: missing host in '" + text + "'");
  out.endpointHost = host;
  if (!port.empty())
    out.endpointPort = static_cast<uint16_t>(usage([&] { return env::parseInt(port, "--rdzv-endpoint port", 0, 65535); }));
}

void parseRdzvConf(const std::string& text, rdzv::RendezvousOptions& out) {
  for (const std::string& item : split(text, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos) throw UsageError("--rdzv-conf: '" + item + "' is not key=value");
    std::string key = item.substr(0, eq);
    std::string value = item.substr(eq + 1);
    std::string what = "--rdzv-conf " + key;
    auto duration = [&] { return usage([&] { return env::parseDuration(value, what); }); };
    if (key == "join_timeout") out.joinTimeout = duration();
    else if (key == "last_call_timeout") out.lastCallTimeout = duration();
    else if (key == "close_timeout") out.closeTimeout = duration();
    else if (key == "heartbeat_interval" || key == "keep_alive_interval") out.heartbeatInterval = duration();
    else if (key == "heartbeat_timeout") out.heartbeatTimeout = duration();
    else if (key == "read_timeout") out.readTimeout = duration();
    else if (key == "timeout") out.joinTimeout = duration();  // torchrun's legacy spelling
    else if (key == "is_host") out.isHost = usage([&] { return env::parseBool(value, what); });
    else if (key == "store_type" && value == "tcp") {}
    else
      throw UsageError("--rdzv-conf: unknown key '" + key +
                       "' (known: join_timeout, last_call_timeout, close_timeout, "
                       "heartbeat_interval, heartbeat_timeout, read_timeout, is_host)");
  }
}

std::string randomRunId() {
  std::random_device rd;
  std::ostringstream out;
  out << std::hex;
  for (int i = 0; i < 4; ++i) out << static_cast<uint32_t>(rd());
  return out.str();
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

}  // namespace

CliResult parseCommandLine(const std::vector<std::string>& args) {
  CLI::App app{"drun: launch a distributed job (torchrun-compatible options)", "drun"};
  app.prefix_command();  // PROGRAM and everything after it belong to the workers
  app.set_help_flag("-h,--help", "print this help and exit");
  app.set_version_flag("--version", "drun 0.1.0");
  app.footer("Usage: drun [options] PROGRAM [ARGS...]   or   drun [options] -m MODULE [ARGS...]");

  std::string nproc = "1", nnodes = "1", maxRestarts = "0", monitorInterval = "0.1", role = "default";
  std::string shutdownTimeout = "30", redirects = "0", tee = "0", localRanksFilter, logDir;
  std::string rdzvBackend = "c10d", rdzvEndpoint, rdzvId = "none", rdzvConf, nodeRank, masterAddr,
              masterPort, localAddr, startMethod = "spawn", logLevel;
  std::optional<std::string> prefix;
  bool standalone = false, module = false, noPython = false, runPath = false, verbose = false;

  auto opt = [&](const std::string& name, std::string& target, const std::string& help) {
    return app.add_option(spellings(name), target, help)->envname(petName(name));
  };
  auto flag = [&](const std::string& names, const std::string& pet, bool& target, const std::string& help) {
    auto* f = app.add_flag(names, target, help);
    if (!pet.empty()) f->envname(pet);
    return f;
  };

  opt("nproc-per-node", nproc, "workers on this node: N, auto, cpu or gpu (default 1)");
  opt("nnodes", nnodes, "number of nodes, N or MIN:MAX (default 1)");
  flag(spellings("standalone"), "PET_STANDALONE", standalone, "single-node job with a private rendezvous");
  opt("max-restarts", maxRestarts, "restarts of the whole job before it fails (default 0)");
  opt("monitor-interval", monitorInterval, "accepted for torchrun compatibility; drun reacts to events");
  opt("role", role, "worker role name (ROLE_NAME, default 'default')");
  opt("shutdown-timeout", shutdownTimeout, "seconds between SIGTERM and SIGKILL when stopping workers (default 30)");
  opt("log-dir", logDir, "write DIR/<run_id>/attempt_<n>/<local_rank>/{stdout,stderr}.log");
  app.add_option("-r,--redirects", redirects, "send streams to log files only: 0-3 or LOCAL_RANK:0-3,...")->envname("PET_REDIRECTS");
  app.add_option("-t,--tee", tee, "copy streams to log files too: 0-3 or LOCAL_RANK:0-3,...")->envname("PET_TEE");
  opt("local-ranks-filter", localRanksFilter, "only these local ranks reach the console, e.g. 0,2");
  app.add_option("--prefix", prefix, "console line prefix; macros ${rank} ${local_rank} ${role_name} ${hostname}; '' = none (default '[${rank}]:' with >1 worker)");
  flag("-m,--module", "PET_MODULE", module, "run PROGRAM as a Python module (python -m)");
  flag(spellings("no-python"), "PET_NO_PYTHON", noPython, "exec PROGRAM as given, even a .py file");
  flag(spellings("run-path"), "PET_RUN_PATH", runPath, "(not supported by drun)");
  opt("start-method", startMethod, "accepted for torchrun compatibility (spawn, fork, forkserver)");
  opt("rdzv-backend", rdzvBackend, "rendezvous backend: c10d (default) or static");
  opt("rdzv-endpoint", rdzvEndpoint, "rendezvous store HOST[:PORT] (default port 29400)");
  opt("rdzv-id", rdzvId, "job id shared by every node (TORCHELASTIC_RUN_ID)");
  opt("rdzv-conf", rdzvConf, "key=value,... : join_timeout, last_call_timeout, close_timeout, heartbeat_interval, heartbeat_timeout, read_timeout, is_host");
  opt("node-rank", nodeRank, "this node's rank (static backend; honoured by c10d when given)");
  opt("master-addr", masterAddr, "MASTER_ADDR for the static backend");
  opt("master-port", masterPort, "MASTER_PORT for the static backend");
  opt("local-addr", localAddr, "this node's address as the other nodes reach it");
  flag("-v,--verbose", "", verbose, "debug logging (same as DRUN_LOG_LEVEL=debug)");
  app.add_option("--log-level", logLevel, "drun's own log level: trace, debug, info, warn, error, off");
  // The user's terminal (agent/README.md "The terminal"): ptys for the workers, stdin to a rank.
  std::string tty = "auto", stdinRank = "0";
  opt("tty", tty, "worker stdout/stderr on pseudo-terminals: auto (where drun's are terminals), always, never");
  opt("stdin", stdinRank, "global rank that reads drun's stdin (default 0), or none (every worker reads /dev/null)");

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

  AgentConfig& c = result.config;
  c.nprocPerNode = parseNproc(nproc);
  auto [minNodes, maxNodes] = parseNnodes(nnodes);
  c.maxRestarts = static_cast<int>(usage([&] { return env::parseInt(maxRestarts, "--max-restarts (a count >= 0)", 0, 1000000); }));
  c.shutdownTimeout = usage([&] { return env::parseDuration(shutdownTimeout, "--shutdown-timeout"); });
  if (role.empty()) throw UsageError("--role: the role name is empty");
  c.role = role;
  c.hostname = thisHostname();

  rdzv::RendezvousOptions& r = c.rendezvous;
  r.minNodes = minNodes;
  r.maxNodes = maxNodes;
  r.localWorldSize = c.nprocPerNode;
  if (rdzvBackend != "c10d" && rdzvBackend != "static")
    throw UsageError("--rdzv-backend: '" + rdzvBackend + "' is not supported (use c10d or static)");
  r.backend = rdzvBackend;
  r.runId = rdzvId.empty() ? "none" : rdzvId;
  if (!rdzvEndpoint.empty()) parseEndpoint(rdzvEndpoint, r);
  parseRdzvConf(rdzvConf, r);
  if (!nodeRank.empty())
    r.nodeRank = static_cast<int>(usage([&] { return env::parseInt(nodeRank, "--node-rank", 0, maxNodes - 1); }));
  r.masterAddr = masterAddr;
  if (!masterPort.empty())
    r.masterPort = static_cast<uint16_t>(usage([&] { return env::parseInt(masterPort, "--master-port", 1, 65535); }));
  r.localAddr = localAddr;
  if (standalone) {
    if (maxNodes > 1) throw UsageError("--standalone runs a single node; it conflicts with --nnodes " + nnodes);
    if (!rdzvEndpoint.empty()) throw UsageError("--standalone picks its own rendezvous; drop --rdzv-endpoint");
    if (r.runId == "none") r.runId = randomRunId();
  }
  if (maxNodes > 1 && r.backend == "c10d" && r.endpointHost.empty())
    throw UsageError("--nnodes " + nnodes + " needs --rdzv-endpoint HOST[:PORT] (the node hosting the rendezvous)");
  if (r.backend == "static" && maxNodes > 1 && !r.nodeRank)
    throw UsageError("--rdzv-backend static with --nnodes " + nnodes + " needs --node-rank");
  if (r.backend == "static" && minNodes != maxNodes)
    throw UsageError("--rdzv-backend static needs a fixed --nnodes, got " + nnodes);

  parseStdSpec(redirects, "--redirects", c.nprocPerNode, &StdRouting::redirect, c.output);
  parseStdSpec(tee, "--tee", c.nprocPerNode, &StdRouting::tee, c.output);
  if (!localRanksFilter.empty()) c.output.consoleLocalRanks = parseRankList(localRanksFilter, c.nprocPerNode);
  if (!logDir.empty()) c.logDir = std::filesystem::path(logDir);
  c.prefixTemplate = prefix;
  c.output.roleName = c.role;
  c.output.hostname = c.hostname;
  parseTerminalOptions(tty, stdinRank, c.output);

  ResolvedProgram program = resolveProgram({rest, module, noPython});
  c.program = std::move(program.argv);
  c.isPython = program.isPython;

  if (verbose) result.logLevel = "debug";
  if (!logLevel.empty()) result.logLevel = logLevel;
  return result;
}

}  // namespace drun::launch

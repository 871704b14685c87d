// parseCommandLine: the options are declared (cli_options.cpp), parsed by CLI11, filled from a
// SLURM step, then read one concern at a time (cli_parts.hpp says which file holds which).
#include "drun/launcher/cli.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <CLI/CLI.hpp>

#include "cli_parts.hpp"
#include "drun/common/env.hpp"
#include "drun/common/host_port.hpp"
#include "drun/common/log.hpp"
#include "drun/common/version.hpp"
#include "drun/agent/worker_env.hpp"
#include "drun/launcher/program.hpp"

namespace drun::launch {
namespace {

using agent::AgentConfig;
using agent::StdRouting;
using cli::usage;

// Options torchrun has that drun accepts only in the forms that mean what drun does.
void checkCompatibilityOptions(const cli::CliText& t) {
  if (t.runPath)
    throw UsageError("--run-path is not supported: drun starts each worker as its own process; "
                     "run the script directly (drun script.py) instead");
  if (!t.startMethod.empty() && t.startMethod != "spawn" && t.startMethod != "fork" && t.startMethod != "forkserver")
    throw UsageError("--start-method: expected spawn, fork or forkserver, got '" + t.startMethod + "'");
  usage([&] { return env::parseDuration(t.monitorInterval, "--monitor-interval"); });
}

// Whether some local rank's stdout reaches drun's stdout (not redirected to its log file only,
// or teed, and not filtered out by --local-ranks-filter).
bool workersStdoutOnConsole(const AgentConfig& c) {
  for (int rank = 0; rank < c.nprocPerNode; ++rank) {
    const auto& shown = c.output.consoleLocalRanks;
    if (shown && std::find(shown->begin(), shown->end(), rank) == shown->end()) continue;
    auto routed = c.output.routing.find(rank);
    const StdRouting& r = routed == c.output.routing.end() ? c.output.defaultRouting : routed->second;
    if (!(r.redirect & 1) || (r.tee & 1)) return true;
  }
  return false;
}

// --duplicate-std{out,err}-filters: the comma-separated substrings, empty ones dropped.
std::vector<std::string> filterList(const std::string& text) {
  std::vector<std::string> out;
  for (std::string& item : cli::split(text, ','))
    if (!item.empty()) out.push_back(std::move(item));
  return out;
}

// The workers' output: log files, the console, the terminal, hangs, events.
void fillOutput(const cli::CliText& t, AgentConfig& c) {
  cli::parseStdSpec(t.redirects, "--redirects", c.nprocPerNode, &StdRouting::redirect, c.output);
  cli::parseStdSpec(t.tee, "--tee", c.nprocPerNode, &StdRouting::tee, c.output);
  if (!t.localRanksFilter.empty()) c.output.consoleLocalRanks = cli::parseRankList(t.localRanksFilter, c.nprocPerNode);
  if (!t.logDir.empty()) {
    cli::checkLogDir(t.logDir);
    c.logDir = std::filesystem::path(t.logDir);
  }
  c.output.logRotation = cli::parseLogRotation(t.logMaxBytes, t.logMaxFiles);
  c.signalsToHandle = cli::parseSignals(t.signalsToHandle);
  if (t.prefix) cli::validatePrefix(*t.prefix);
  c.prefixTemplate = t.prefix;
  c.output.roleName = c.role;
  c.output.hostname = c.hostname;
  cli::parseTerminalOptions(t.tty, t.stdinRank, c.output);
  if (!t.hangTimeout.empty()) usage([&] { agent::parseHangTimeout(t.hangTimeout, c.hangs); return 0; });
  if (!t.hangIdle.empty()) usage([&] { agent::parseHangIdle(t.hangIdle, c.hangs); return 0; });
  c.eventsPath = t.eventsPath;
  // `-` is drun's stdout: one JSON object per line there, so no worker's stdout may share it.
  if (t.eventsPath == "-" && workersStdoutOnConsole(c))
    throw UsageError("--events - (or DRUN_EVENTS=-) writes the events to stdout, which carries the "
                     "workers' output here; write them to a file with --events FILE, or keep the "
                     "workers' stdout in their log files (--redirects 1 --log-dir DIR)");
  if (!t.eventsPath.empty() && t.eventsPath != "-") {  // said now, before anything is set up
    std::FILE* f = std::fopen(t.eventsPath.c_str(), "a");
    if (!f) throw UsageError("--events " + t.eventsPath + ": cannot open it: " + std::strerror(errno));
    std::fclose(f);
  }
  c.jobHistory = usage([] { return env::getBool("DRUN_JOB_HISTORY"); });
  c.output.duplicateStdoutFilters = filterList(t.duplicateStdoutFilters);
  c.output.duplicateStderrFilters = filterList(t.duplicateStderrFilters);
}

// Where the workers run: --numa-binding, --virtual-local-rank; and the agent's health check port.
void fillPlacement(const cli::CliText& t, AgentConfig& c) {
  if (!t.numaBinding.empty()) {
    std::optional<agent::NumaMode> mode = agent::parseNumaMode(t.numaBinding);
    if (!mode)
      throw UsageError("--numa-binding: expected node, socket, exclusive or core-complex, got '" + t.numaBinding + "'");
    c.numaBinding = *mode;
  }
  c.virtualLocalRank = t.virtualLocalRank;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (c.virtualLocalRank && visible) {
    const size_t devices = agent::splitDeviceList(visible).size();
    if (devices < static_cast<size_t>(c.nprocPerNode))
      throw UsageError("--virtual-local-rank: CUDA_VISIBLE_DEVICES='" + std::string(visible) + "' names " +
                       std::to_string(devices) + " device(s) for " + std::to_string(c.nprocPerNode) +
                       " local ranks");
  }
  // A standby worker starts before its local rank is known: it could be neither bound nor narrowed.
  if (c.numaBinding != agent::NumaMode::Off || c.virtualLocalRank) {
    if (c.recovery.standbyWorkers.value_or(0) > 0)
      throw UsageError("--rdzv-conf standby_workers: standby workers start before their local rank is "
                       "known, so they cannot be used with --numa-binding or --virtual-local-rank");
    c.recovery.standbyWorkers = 0;
  }
  if (const char* port = std::getenv("TORCHELASTIC_HEALTH_CHECK_PORT"); port && *port)
    c.healthCheckPort = static_cast<uint16_t>(
        usage([&] { return env::parseInt(port, "TORCHELASTIC_HEALTH_CHECK_PORT (a port, 0-65535)", 0, 65535); }));
}

}  // namespace

// HOST, HOST:PORT, [V6], [V6]:PORT (HostPort's rules); a missing port keeps out's.
void parseEndpoint(const std::string& text, rdzv::RendezvousOptions& out) {
  out.endpoint = usage([&] {
    return HostPort::parse(text, {"--rdzv-endpoint", out.endpoint.port});  // port 0: nobody could join
  });
}

CliResult parseCommandLine(const std::vector<std::string>& args) {
  CLI::App app{"drun: launch a distributed job (torchrun-compatible options)", "drun"};
  cli::CliText t;
  cli::declareOptions(app, t);

  std::vector<std::string> reversed(args.rbegin(), args.rend() - 1);
  CliResult result;
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    result.printAndExit = app.help();
    return result;
  } catch (const CLI::CallForVersion&) {
    result.printAndExit = std::string("drun ") + kVersion + "\n";
    return result;
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }

  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
  else if (!rest.empty() && rest.front().size() > 1 && rest.front().front() == '-')
    throw UsageError("unknown option '" + rest.front() + "' (see drun --help)");
  checkCompatibilityOptions(t);

  const cli::Given given = [&app](const std::string& name) { return app.get_option("--" + name)->count() > 0; };
  const std::optional<bool> slurmIsHost = cli::mergeSlurmStep(t, given, result);

  AgentConfig& c = result.config;
  c.nprocPerNode = cli::parseNproc(t.nproc);
  const std::pair<int, int> nodes = cli::parseNnodes(t.nnodes);
  c.rendezvous.maxRestarts = static_cast<int>(usage([&] { return env::parseInt(t.maxRestarts, "--max-restarts (a count >= 0)", 0, 1000000); }));
  c.shutdownTimeout = usage([&] { return env::parseDuration(t.shutdownTimeout, "--shutdown-timeout"); });
  if (t.role.empty()) throw UsageError("--role: the role name is empty");
  c.role = t.role;
  c.hostname = cli::thisHostname();
  cli::fillRendezvous(t, given, nodes, slurmIsHost, result);
  fillOutput(t, c);
  fillPlacement(t, c);

  ResolvedProgram program = resolveProgram({rest, t.module, t.noPython});
  c.program = std::move(program.argv);
  c.isPython = program.isPython;
  c.interpreter = std::move(program.interpreter);

  if (t.verbose) result.logLevel = "debug";
  if (!t.logLevel.empty()) result.logLevel = t.logLevel;
  if (!t.logFormat.empty()) {
    usage([&] { return log::parseFormat(t.logFormat, "--log-format"); });
    result.logFormat = t.logFormat;
  }
  return result;
}

}  // namespace drun::launch

// The parts of parseCommandLine (cli.cpp), one concern per file:
//   cli_options.cpp     the options drun declares (spellings, PET_* names, help) into CliText
//   cli_values.cpp      one option's text into its value (counts, ranks, signals, ...)
//   rdzv_conf.cpp       --rdzv-conf's keys: the table, its parser and its help
//   cli_rendezvous.cpp  the SLURM step's fill and the rendezvous settings with their checks
// Every function throws UsageError naming the option. Stateless; thread-safe.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "drun/agent/agent_config.hpp"
#include "drun/launcher/cli.hpp"

namespace CLI {
class App;
}  // namespace CLI

namespace drun::launch::cli {

// Every option's text as given (command line, else PET_*, else the default), before any is read.
struct CliText {
  std::string nproc = "1", nnodes = "1", maxRestarts = "0", monitorInterval = "0.1", role = "default";
  std::string shutdownTimeout = "30", redirects = "0", tee = "0", localRanksFilter, logDir;
  std::string logMaxBytes = "0", logMaxFiles = "5", logFormat;
  std::string rdzvBackend = "c10d", rdzvEndpoint, rdzvId = "none", rdzvConf, nodeRank, masterAddr,
              masterPort, localAddr, startMethod = "spawn", logLevel;
  std::optional<std::string> prefix;
  bool standalone = false, module = false, noPython = false, runPath = false, verbose = false;
  bool noSlurm = false;
  std::string hangTimeout, hangIdle;
  std::string recovery = "restart";
  std::string eventsPath;  // DRUN_EVENTS unless given
  std::string tty = "auto", stdinRank = "0";
  std::string signalsToHandle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  std::string numaBinding;                                     // "" = off
  bool virtualLocalRank = false;
  std::string duplicateStdoutFilters, duplicateStderrFilters;  // "A,B,..."
};

// Whether the command line or PET_* gave the option "nnodes", "rdzv-backend", ... (CLI11's
// count() counts both).
using Given = std::function<bool(const std::string& name)>;

// ---- cli_options.cpp
// Declares drun's options on `app`, bound to `text`, with the help footer.
void declareOptions(CLI::App& app, CliText& text);

// ---- cli_values.cpp
// Runs f(); its InvalidArgument (from env::parse*) becomes a UsageError.
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
std::vector<std::string> split(const std::string& text, char sep);
int parseNproc(const std::string& text);
std::pair<int, int> parseNnodes(const std::string& text);  // {MIN, MAX}
void parseStdSpec(const std::string& text, const char* option, int nproc, int agent::StdRouting::*field,
                  agent::OutputOptions& out);
std::vector<int> parseRankList(const std::string& text, int nproc);
void validatePrefix(const std::string& tmpl);
void parseTerminalOptions(const std::string& tty, const std::string& stdinRank, agent::OutputOptions& out);
std::vector<int> parseSignals(const std::string& text);
void checkLogDir(const std::filesystem::path& dir);
agent::LogRotation parseLogRotation(const std::string& maxBytes, const std::string& maxFiles);
std::string randomRunId();
std::string thisHostname();

// ---- rdzv_conf.cpp
// The --rdzv-conf keys, one per line, for --help.
std::string rendezvousConfHelp();

// ---- cli_rendezvous.cpp
// Under an srun step (and without --no-slurm/--standalone): the step fills nnodes, node-rank,
// rdzv-endpoint and rdzv-id where none was given, and says so in result.notes. Returns whether
// this node hosts the store (the step's first node does); nullopt outside a step.
std::optional<bool> mergeSlurmStep(CliText& text, const Given& given, CliResult& result);
// The rendezvous settings from the options' text, checked against each other.
void fillRendezvous(const CliText& text, const Given& given, std::pair<int, int> nodes,
                    std::optional<bool> slurmIsHost, CliResult& result);

}  // namespace drun::launch::cli

// The drun command line: torchrun-compatible options (dash and underscore spellings), PET_*
// environment overrides, validation. Produces the one AgentConfig the agent runs.
//
// Nothing else in drun reads argv or the PET_*/SLURM_* environment for job settings. Every bad
// input throws UsageError with one message naming what was wrong; main() prints it as
// "drun: error: <message>" and exits 2 before anything is started. Stateless; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "drun/agent/agent_config.hpp"
#include "drun/common/error.hpp"

namespace drun::launch {

class UsageError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

struct CliResult {
  agent::AgentConfig config;
  std::optional<std::string> logLevel;  // -v / --log-level
  std::optional<std::string> logFormat;  // --log-format (checked: text or json)
  std::optional<std::string> printAndExit;  // --help / --version text: print, exit 0
  std::vector<std::string> warnings;        // accepted but worth saying (main prints them)
  std::vector<std::string> notes;           // info for the log once it is set up (what came from SLURM)
};

// --rdzv-endpoint's HOST, HOST:PORT, [V6] or [V6]:PORT (drun/common/host_port.hpp) into
// out.endpoint (a missing port keeps out's). Throws UsageError. (drun status parses its endpoint
// alike.)
void parseEndpoint(const std::string& text, rdzv::RendezvousOptions& out);

// --rdzv-conf's KEY=VALUE,... into `out` and, for recovery_timeout, into `recovery` (drun status
// takes the etcd keys alike, and passes no `recovery`: the key is checked, not kept). Throws
// UsageError.
void parseRendezvousConf(const std::string& text, rdzv::RendezvousOptions& out,
                         agent::RecoveryOptions* recovery = nullptr);

// argv[0] is the program name. Throws UsageError.
CliResult parseCommandLine(const std::vector<std::string>& args);

}  // namespace drun::launch

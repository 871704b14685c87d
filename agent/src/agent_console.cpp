#include "agent_console.hpp"

#include "drun/agent/failure_summary.hpp"

namespace drun::agent::detail {

void AgentConsole::sayFinalCause(const rdzv::FailureRecord& cause, const AgentConfig& config) {
  if (gone()) {
    say("drun: the console was closed (broken pipe); the job ends without restarts (rank {}: "
        "{})\n", cause.rank, describeStatus(cause));
    return;
  }
  say("{}\n", formatFailureSummary(cause));
  if (config.isPython && !config.interpreter.empty())
    say("drun:   python on this node: {}\n", config.interpreter);
  if (config.rendezvous.maxRestarts > 0)
    say("drun: restart budget exhausted ({} restarts)\n", config.rendezvous.maxRestarts);
}

}  // namespace drun::agent::detail

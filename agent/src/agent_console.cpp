#include "agent_console.hpp"

#include "drun/agent/failure_summary.hpp"
#include "drun/common/log.hpp"

namespace drun::agent::detail {

void AgentConsole::emit(std::string text) {
  if (log::format() != log::Format::Json) {
    writer_->write(ConsoleStream::Err, std::move(text));
    return;
  }
  std::string json;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + start, end - start);
    start = end + 1;
    if (line.rfind("drun: ", 0) == 0) line.remove_prefix(6);
    const char* level = "info";
    if (line.rfind("warning: ", 0) == 0) level = "warning", line.remove_prefix(9);
    else if (line.rfind("error: ", 0) == 0) level = "error", line.remove_prefix(7);
    json += log::jsonLine("drun", level, line);
  }
  writer_->write(ConsoleStream::Err, std::move(json));
}

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

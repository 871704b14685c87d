// AgentConsole: the agent's own lines on drun's stderr. They go through the console writer, like
// the workers' output: they never block the loop on a stopped reader, and they stay in order
// with the workers' lines. say() formats with fmt, its format string checked at compile time.
//
// Threading: any thread (the console writer's rules). Ownership: shares the console writer.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include <spdlog/fmt/fmt.h>

#include "drun/agent/agent_config.hpp"
#include "drun/agent/console_writer.hpp"
#include "drun/rendezvous/rendezvous.hpp"

namespace drun::agent::detail {

class AgentConsole {
 public:
  explicit AgentConsole(std::shared_ptr<ConsoleWriter> writer = ConsoleWriter::standard())
      : writer_(std::move(writer)) {}

  // Writes the formatted text as is (lines end with the "\n" the format has); under
  // --log-format json, each line as one JSON log line (its "drun: " prefix dropped).
  template <typename... Args>
  void say(fmt::format_string<Args...> format, Args&&... args) {
    emit(fmt::format(format, std::forward<Args>(args)...));
  }

  // The console's reader went away (`drun ... | head`): a write to stdout or stderr failed.
  bool gone() const {
    return writer_->broken(ConsoleStream::Out) || writer_->broken(ConsoleStream::Err);
  }

  // The job's end with `cause` as its root cause: the failure summary, the interpreter, the
  // spent budget; or one line when the console is gone.
  void sayFinalCause(const rdzv::FailureRecord& cause, const AgentConfig& config);

  const std::shared_ptr<ConsoleWriter>& writer() const { return writer_; }

 private:
  void emit(std::string text);

  std::shared_ptr<ConsoleWriter> writer_;
};

}  // namespace drun::agent::detail

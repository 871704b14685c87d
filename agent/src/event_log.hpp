// EventLog: the agent's structured events (docs/observe.md): each thing that
// happened to the job (a round formed, a worker started or exited, a failure, a restart, a lost
// or waiting node, a hang, the job's end) as one JSON object of schema v1 with its time, the run
// id and this node, handed to every sink: --events' file (or stderr) and the job's history in
// the store (rdzv/<id>/events/, job_history.hpp).
//
// Threading: emit()/flush() on the agent's loop thread; sinks never block it (they queue; the
// writing happens on their own thread, each store call with its deadline).
// Ownership: the log owns its sinks.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "drun/agent/console_writer.hpp"
#include "drun/store/store.hpp"

namespace drun::agent::detail {

class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void write(const nlohmann::json& event) = 0;  // queues; never blocks
  virtual bool flush(std::chrono::milliseconds deadline) = 0;
};

// --events PATH: one line per event appended to PATH (created if missing); "-": stderr, through
// the console writer (in order with drun's other lines). Throws InvalidArgument when PATH cannot
// be opened, naming it.
std::unique_ptr<EventSink> makeFileEventSink(const std::string& path,
                                             std::shared_ptr<ConsoleWriter> console);
// The job's history in the store, on a connection of its own opened by `connect` at the first
// event (again after an error).
std::unique_ptr<EventSink> makeStoreEventSink(
    std::function<std::unique_ptr<rdzv::LivenessStore>()> connect, std::string runId);

class EventLog {
 public:
  EventLog(std::string runId, std::string node) : runId_(std::move(runId)), node_(std::move(node)) {}
  void add(std::unique_ptr<EventSink> sink) { sinks_.push_back(std::move(sink)); }
  bool enabled() const { return !sinks_.empty(); }
  // {"v":1,"event":kind,"ts":"<UTC ISO 8601, ms>","ts_ms":<epoch ms>,"run_id","node","agent_pid",
  //  ...fields}
  void emit(std::string_view kind, nlohmann::json fields = nlohmann::json::object());
  // Waits for every sink to write what it was given, all within `deadline`.
  void flush(std::chrono::milliseconds deadline);

 private:
  std::string runId_;
  std::string node_;
  std::vector<std::unique_ptr<EventSink>> sinks_;
};

}  // namespace drun::agent::detail

#include "event_log.hpp"

#include <unistd.h>

#include <ctime>
#include <spdlog/spdlog.h>

#include "drun/rendezvous/job_history.hpp"

namespace drun::agent::detail {
namespace {

using Clock = std::chrono::system_clock;

std::string isoTime(Clock::time_point when) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(when.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm utc{};
  ::gmtime_r(&seconds, &utc);
  char text[80];  // room for any int in every field (-Wformat-truncation checks the bound)
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<int>(ms % 1000));
  return text;
}

}  // namespace

void EventLog::emit(std::string_view kind, nlohmann::json fields) {
  if (sinks_.empty()) return;
  const auto now = Clock::now();
  nlohmann::json event = {
      {"v", rdzv::kEventSchemaVersion},
      {"event", std::string(kind)},
      {"ts", isoTime(now)},
      {"ts_ms", std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count()},
      {"run_id", runId_},
      {"node", node_},
      {"agent_pid", static_cast<int64_t>(::getpid())}};
  if (fields.is_object()) event.update(fields);
  for (auto& sink : sinks_) sink->write(event);
}

void EventLog::flush(std::chrono::milliseconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  for (auto& sink : sinks_) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (!sink->flush(std::max(left, std::chrono::milliseconds(0))))
      spdlog::debug("agent: events not all written within {} ms", deadline.count());
  }
}

}  // namespace drun::agent::detail

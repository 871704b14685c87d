#include "drun/common/log.hpp"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <mutex>

#include <nlohmann/json.hpp>

#include "drun/common/env.hpp"
#include "drun/common/error.hpp"

namespace drun::log {
namespace {

std::atomic<Format> chosenFormat{Format::Text};

// setField's fields, read by every JSON line.
struct Fields {
  std::mutex mutex;
  std::map<std::string, std::string> values;
};
Fields& fields() {
  static Fields f;
  return f;
}

// RFC 3339, UTC, milliseconds: the events' "ts" and the text lines' time alike.
std::string rfc3339(std::chrono::system_clock::time_point when) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(when.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char out[80];
  std::snprintf(out, sizeof out, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, static_cast<int>(ms % 1000));
  return out;
}

std::string jsonAt(std::chrono::system_clock::time_point when, std::string_view component,
                   std::string_view level, std::string_view message) {
  nlohmann::ordered_json line = {{"time", rfc3339(when)},
                                 {"level", std::string(level)},
                                 {"component", std::string(component)},
                                 {"message", std::string(message)}};
  {
    Fields& f = fields();
    std::lock_guard lock(f.mutex);
    for (const auto& [name, value] : f.values) line[name] = value;
  }
  // Invalid UTF-8 in a message (a peer's text) becomes U+FFFD rather than an exception.
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

// Writes each record as one JSON line to stderr, flushed (as the stderr logger's lines).
class JsonStderrSink : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const auto level = spdlog::level::to_string_view(msg.level);
    const std::string line = jsonAt(msg.time, std::string_view(msg.logger_name.data(), msg.logger_name.size()),
                                    std::string_view(level.data(), level.size()),
                                    std::string_view(msg.payload.data(), msg.payload.size()));
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
  }
  void flush_() override { std::fflush(stderr); }
};

}  // namespace

void init(std::string_view component, std::string_view level, std::string_view format) {
  std::string name = level.empty() ? env::getString("DRUN_LOG_LEVEL") : std::string(level);
  auto parsed = spdlog::level::from_str(name);
  if (parsed == spdlog::level::off && name != "off")
    throw InvalidArgument("log level: unknown name '" + name +
                          "' (expected trace, debug, info, warn, error or off)");
  const Format chosen = format.empty() ? parseFormat(env::getString("DRUN_LOG_FORMAT"), "DRUN_LOG_FORMAT")
                                       : parseFormat(format, "--log-format");
  std::shared_ptr<spdlog::logger> logger;
  if (chosen == Format::Json) {
    logger = std::make_shared<spdlog::logger>(std::string(component), std::make_shared<JsonStderrSink>());
    spdlog::register_logger(logger);
  } else {
    logger = spdlog::stderr_logger_mt(std::string(component));
    // One style for every log line: "drun: <UTC time> <level>: ...", the time as the events'
    // "ts" (ISO 8601, ms), so that a log line and an event of one moment read alike.
    logger->set_pattern("%n: %Y-%m-%dT%H:%M:%S.%eZ %l: %v", spdlog::pattern_time_type::utc);
  }
  logger->set_level(parsed);
  chosenFormat = chosen;
  spdlog::set_default_logger(logger);
}

Format format() { return chosenFormat; }

void setField(const std::string& name, const std::string& value) {
  Fields& f = fields();
  std::lock_guard lock(f.mutex);
  if (value.empty()) f.values.erase(name);
  else f.values[name] = value;
}

std::string jsonLine(std::string_view component, std::string_view level, std::string_view message) {
  return jsonAt(std::chrono::system_clock::now(), component, level, message);
}

void ensureRegistry() { spdlog::default_logger_raw(); }

}  // namespace drun::log

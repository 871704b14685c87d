#include "drun/common/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "drun/common/env.hpp"
#include "drun/common/error.hpp"

namespace drun::log {

void init(std::string_view component, std::string_view level) {
  std::string name = level.empty() ? env::getString("DRUN_LOG_LEVEL") : std::string(level);
  auto parsed = spdlog::level::from_str(name);
  if (parsed == spdlog::level::off && name != "off")
    throw InvalidArgument("log level: unknown name '" + name +
                          "' (expected trace, debug, info, warn, error or off)");
  auto logger = spdlog::stderr_logger_mt(std::string(component));
  logger->set_level(parsed);
  // One style for every log line: "drun: <UTC time> <level>: ...", the time as the events'
  // "ts" (ISO 8601, ms), so that a log line and an event of one moment read alike.
  logger->set_pattern("%n: %Y-%m-%dT%H:%M:%S.%eZ %l: %v", spdlog::pattern_time_type::utc);
  spdlog::set_default_logger(logger);
}

void ensureRegistry() { spdlog::default_logger_raw(); }

}  // namespace drun::log

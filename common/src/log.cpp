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
  // One style for every line drun writes itself: "drun: <level>: ..." as its own messages
  // ("drun: error: ...", "drun: warning: ..."); debug lines carry the time too.
  logger->set_pattern(parsed <= spdlog::level::debug ? "%n: %H:%M:%S.%e %l: %v" : "%n: %l: %v");
  spdlog::set_default_logger(logger);
}

void ensureRegistry() { spdlog::default_logger_raw(); }

}  // namespace drun::log

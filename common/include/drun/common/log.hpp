// Logging setup: spdlog, one logger per process, level from DRUN_LOG_LEVEL or -v.
//
// Call drun::log::init() once from main(); components then use spdlog::debug/info/... directly.
// Every state transition and retry is logged at debug with timings. Thread-safe (spdlog's _mt).
#pragma once

#include <string_view>

namespace drun::log {

// Sets up a stderr logger named `component` with pattern "[component] message" (plus time at
// debug). `level` overrides DRUN_LOG_LEVEL when non-empty. Unknown level names throw
// InvalidArgument.
void init(std::string_view component, std::string_view level = {});

}  // namespace drun::log

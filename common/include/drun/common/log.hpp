// Logging setup: spdlog, one logger per process, level from DRUN_LOG_LEVEL or -v.
//
// Call drun::log::init() once from main(); components then use spdlog::debug/info/... directly.
// Every state transition and retry is logged at debug with timings. Thread-safe (spdlog's _mt).
#pragma once

#include <string_view>

namespace drun::log {

// Sets up a stderr logger named `component`, each line "component: <UTC ISO 8601 time, ms>
// <level>: message". `level` overrides DRUN_LOG_LEVEL when non-empty. Unknown level names throw
// InvalidArgument.
void init(std::string_view component, std::string_view level = {});

// Creates spdlog's registry (a lazy singleton) now, if it does not exist yet. Call it before
// starting a thread that logs, and before constructing a static that logs in its destructor:
// - libspdlog is not instrumented, so when a new thread's first log line and its creator's race
//   to create the registry, ThreadSanitizer sees the construction and the read unordered;
// - statics are destroyed in reverse order of construction: one built after the registry is
//   destroyed before it, so its threads never log into a destroyed registry at exit.
void ensureRegistry();

}  // namespace drun::log

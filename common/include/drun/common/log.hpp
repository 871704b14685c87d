// Logging setup: spdlog, one logger per process, level from DRUN_LOG_LEVEL or -v, line format from
// DRUN_LOG_FORMAT or --log-format.
//
// Call drun::log::init() once from main(); components then use spdlog::debug/info/... directly.
// Every state transition and retry is logged at debug with timings. Thread-safe (spdlog's _mt).
#pragma once

#include <string>
#include <string_view>

namespace drun::log {

// How a log line reads. Text: "component: <UTC ISO 8601 time, ms> <level>: message". Json: one
// object per line, {"time": RFC 3339 UTC with ms, "level", "component", "message"} and the
// fields given to setField (e.g. "node").
enum class Format { Text, Json };

// "text" or "json"; anything else throws InvalidArgument naming `what` (an option or variable).
Format parseFormat(std::string_view text, std::string_view what);

// Sets up a stderr logger named `component`. `level` overrides DRUN_LOG_LEVEL and `format`
// DRUN_LOG_FORMAT when non-empty. Unknown level or format names throw InvalidArgument.
void init(std::string_view component, std::string_view level = {}, std::string_view format = {});

// The format init() chose (Text before init).
Format format();

// Adds `name`: `value` to every JSON line from now on (a known node rank, a host); an empty value
// removes it. Text lines do not show them.
void setField(const std::string& name, const std::string& value);

// One JSON line as the logger writes under Format::Json, stamped now and ending in '\n', for what
// a component writes to stderr beside its logger (progress lines, errors); `level` as spdlog
// names it ("info", "error", ...).
std::string jsonLine(std::string_view component, std::string_view level, std::string_view message);

// Creates spdlog's registry (a lazy singleton) now, if it does not exist yet. Call it before
// starting a thread that logs, and before constructing a static that logs in its destructor:
// - libspdlog is not instrumented, so when a new thread's first log line and its creator's race
//   to create the registry, ThreadSanitizer sees the construction and the read unordered;
// - statics are destroyed in reverse order of construction: one built after the registry is
//   destroyed before it, so its threads never log into a destroyed registry at exit.
void ensureRegistry();

}  // namespace drun::log

#include "drun/common/env.hpp"

#include <cctype>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <stdexcept>

#include "drun/common/error.hpp"

namespace drun::env {
namespace {

// The one list of DRUN_* variables. Keep sorted by name.
constexpr VarDoc kDrunEnvVars[] = {
    {"DRUN_COMM_CHECK", VarType::String, "sampled",
     "libdrun_comm: ranks compare collectives' arguments (op, dtype, count, root, reduce op) and "
     "fail naming both sides on a mismatch: sampled (the first 16, then a hash every "
     "DRUN_COMM_CHECK_INTERVAL), true (each, before it runs) or false"},
    {"DRUN_COMM_CHECK_INTERVAL", VarType::Int, "100",
     "libdrun_comm: with DRUN_COMM_CHECK=sampled, the ranks compare every this many collectives (1-4096)"},
    {"DRUN_COMM_SHM_BYTES", VarType::Int, "4194304",
     "libdrun_comm (shm): bytes of each rank's collective slot in the host's shared segment"},
    {"DRUN_COMM_SHM_SINGLE_COPY", VarType::Bool, "true",
     "libdrun_comm (shm): large collectives read the peers' buffers directly (process_vm_readv) "
     "where the kernel allows it"},
    {"DRUN_COMM_SHM_UNEXPECTED_BYTES", VarType::Int, "67108864",
     "libdrun_comm (shm): bytes of point-to-point messages a rank keeps for receives not posted "
     "yet; beyond them its senders wait"},
    {"DRUN_COMM_SHM_SPIN", VarType::DurationMs, "10ms",
     "libdrun_comm (shm): how long a collective's wait spins (50 us) and then yields before it "
     "sleeps (CPU for latency)"},
    {"DRUN_COMM_TIMEOUT", VarType::DurationMs, "300s",
     "libdrun_comm: default timeout of init and of every operation (InitOptions.timeout wins)"},
    {"DRUN_COMM_TRANSPORT", VarType::String, "auto",
     "libdrun_comm (gloo): shm, tcp or auto (shared memory among the ranks on one host, "
     "hierarchical across hosts)"},
    {"DRUN_EVENTS", VarType::String, "",
     "drun: where the job's events go, one JSON object per line (as --events: a file, or - for "
     "stdout when the workers' stdout goes to their log files; docs/observe.md)"},
    {"DRUN_GENERATION", VarType::Int, "0",
     "set by drun in each worker under --recovery in-process: the generation the process was "
     "started in (0 at the round's start, g for a replacement; docs/recovery.md)"},
    {"DRUN_JOB_HISTORY", VarType::Bool, "true",
     "drun: append the job's events to the rendezvous store (rdzv/<id>/events/, the last 256): "
     "what drun status and drun-rendezvous --http show; 0 turns it off"},
    {"DRUN_LOG_FORMAT", VarType::String, "text",
     "format of the log lines of drun and drun-rendezvous themselves (not the workers' output): text "
     "(timestamped lines) or json (one object per line; as --log-format)"},
    {"DRUN_LOG_LEVEL", VarType::String, "warn",
     "log level of drun itself: trace, debug, info, warn, error, off (-v sets debug)"},
    {"DRUN_PYTHON", VarType::String, "python3",
     "interpreter for .py programs and -m modules (PYTHON_EXEC is honoured too, as torchrun)"},
    {"DRUN_RDZV_TOKEN_FILE", VarType::String, "",
     "the rendezvous store's shared secret, a file of mode 600 (as --rdzv-conf token_file): the "
     "store and every client of it prove it; workers' comm bootstrap store too"},
    {"DRUN_RECOVERY", VarType::String, "",
     "set by drun in each worker: in-process under --recovery in-process (a lost rank is replaced "
     "and the others re-form in place), unset under --recovery restart (docs/recovery.md)"},
    {"DRUN_SOCKET_IFNAME", VarType::String, "",
     "libdrun_comm (gloo): network interface for worker traffic (GLOO_SOCKET_IFNAME is honoured too)"},
    {"DRUN_WORKER_CHANNEL", VarType::String, "",
     "set by drun in each worker: its channel page for heartbeats and sections (drun.worker, "
     "drun/worker.h; docs/hangs.md); unset, the worker API is a no-op"},
    {"DRUN_WORKER_STORE", VarType::String, "",
     "set by drun in each worker under --recovery in-process: host:port of the workers' store, "
     "which outlives every rank (libdrun_comm's and drun.torch's env:// use it)"},
    {"DRUN_WORKER_STORE_PREFIX", VarType::String, "",
     "set by drun beside DRUN_WORKER_STORE: the key prefix of this round in the workers' store "
     "(ends in /)"},
    {"DRUN_TORCH_HEARTBEAT_MS", VarType::Int, "1000",
     "drun.torch: each rank's heartbeat period in the process group's store, milliseconds (0: off)"},
    {"DRUN_TORCH_HEARTBEAT_STALE_MS", VarType::Int, "4000",
     "drun.torch: a rank whose heartbeat did not change for this long is named as not heard from"},
};

const VarDoc& lookup(std::string_view name) {
  for (const auto& v : kDrunEnvVars)
    if (v.name == name) return v;
  throw std::logic_error("unregistered DRUN_ variable: " + std::string(name));
}

std::string valueOrDefault(std::string_view name) {
  const VarDoc& doc = lookup(name);
  if (auto v = get(std::string(name).c_str())) return *v;
  return std::string(doc.defaultValue);
}

}  // namespace

std::span<const VarDoc> drunVariables() { return kDrunEnvVars; }

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

std::string getString(std::string_view name) { return valueOrDefault(name); }

long long getInt(std::string_view name) {
  return parseInt(valueOrDefault(name), name, LLONG_MIN, LLONG_MAX);
}

std::chrono::milliseconds getDuration(std::string_view name) {
  return parseDuration(valueOrDefault(name), name);
}

bool getBool(std::string_view name) { return parseBool(valueOrDefault(name), name); }

long long parseInt(std::string_view text, std::string_view what, long long min, long long max) {
  long long value = 0;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(first, last, value);
  if (text.empty() || ec != std::errc() || ptr != last)
    throw InvalidArgument(std::string(what) + ": expected an integer, got '" + std::string(text) +
                          "'");
  if (value < min || value > max)
    throw InvalidArgument(std::string(what) + ": " + std::to_string(value) + " is out of range [" +
                          std::to_string(min) + ", " + std::to_string(max) + "]");
  return value;
}

std::chrono::milliseconds parseDuration(std::string_view text, std::string_view what) {
  // Number (integer or decimal) followed by an optional unit: ms, s, m, h. Bare = seconds.
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  std::string number(text.substr(0, i));
  std::string_view unit = text.substr(i);
  double scale = 1000.0;
  if (unit.empty() || unit == "s") scale = 1000.0;
  else if (unit == "ms") scale = 1.0;
  else if (unit == "m") scale = 60'000.0;
  else if (unit == "h") scale = 3'600'000.0;
  else number.clear();
  char* end = nullptr;
  double value = number.empty() ? -1 : std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size() || value < 0 || value > 1e9)
    throw InvalidArgument(std::string(what) + ": expected a duration such as 30, 30s, 500ms or 2m, got '" +
                          std::string(text) + "'");
  return std::chrono::milliseconds(static_cast<long long>(value * scale + 0.5));
}

bool parseBool(std::string_view text, std::string_view what) {
  std::string lower;
  for (char c : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "1" || lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower == "0" || lower == "false" || lower == "no" || lower == "off" || lower.empty())
    return false;
  throw InvalidArgument(std::string(what) + ": expected a boolean (1/0, true/false), got '" +
                        std::string(text) + "'");
}

}  // namespace drun::env

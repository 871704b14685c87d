#include "history_file.hpp"

#include <optional>

#include <nlohmann/json.hpp>

#include "drun/common/error.hpp"
#include "drun/rendezvous/keys.hpp"

namespace drun::rdzv::state {
namespace {

constexpr std::string_view kRoot = "rdzv/";
constexpr std::string_view kEventNext = "events/next";
constexpr std::string_view kOutcome = "outcome";
constexpr std::string_view kRound = "round";

// Whether `name` (a key below rdzv/<id>/) is "events/<slot>".
bool isEventSlot(std::string_view name) {
  constexpr std::string_view kEvents = "events/";
  if (!name.starts_with(kEvents)) return false;
  const std::string_view slot = name.substr(kEvents.size());
  if (slot.empty() || slot.size() > 3 || (slot.size() > 1 && slot[0] == '0')) return false;
  for (char c : slot)
    if (c < '0' || c > '9') return false;
  return std::stoull(std::string(slot)) < keys::kEventSlots;
}

bool isKeptName(std::string_view name) {
  return name == kEventNext || name == kOutcome || name == kRound || isEventSlot(name);
}

bool isDecimal(std::string_view text) {
  if (text.empty() || text.size() > 19) return false;
  for (char c : text)
    if (c < '0' || c > '9') return false;
  return true;
}

// `value` as a JSON string, or nothing when it is not UTF-8 text.
std::optional<std::string> jsonString(const Bytes& value) {
  try {
    return nlohmann::json(value).dump();
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

// One job's kept keys as a JSON object text ("{...}"), empty when it has none.
std::string jobEntry(const StoreCore& core, const std::string& runId) {
  const std::string prefix = keys::job(runId);
  std::vector<std::pair<std::string, std::string>> fields;  // name, JSON string
  auto keep = [&](const std::string& name) {
    const Bytes* value = core.find(prefix + name);
    if (!value) return false;
    auto text = jsonString(*value);
    if (text) fields.emplace_back(name, std::move(*text));
    return text.has_value();
  };
  keep(std::string(kEventNext));
  for (uint64_t slot = 0; slot < keys::kEventSlots; ++slot) keep("events/" + std::to_string(slot));
  // The tombstone only of an ended job: a round alone is a running job's.
  if (keep(std::string(kOutcome))) keep(std::string(kRound));
  if (fields.empty()) return {};
  std::string entry = "{";
  for (const auto& [name, text] : fields) {
    if (entry.size() > 1) entry += ',';
    entry += nlohmann::json(name).dump() + ':' + text;
  }
  return entry + '}';
}

[[noreturn]] void invalid(const std::string& what) { throw InvalidArgument(what); }

// Untrusted text as an error message shows it: its first 64 bytes, quoted, escaped to ASCII.
std::string quoted(const std::string& text) {
  return nlohmann::json(text.substr(0, 64)).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
}

}  // namespace

bool isHistoryKey(std::string_view key) {
  if (!key.starts_with(kRoot)) return false;
  const size_t slash = key.find('/', kRoot.size());
  return slash != std::string_view::npos && isKeptName(key.substr(slash + 1));
}

HistorySnapshot snapshotHistory(const StoreCore& core, size_t maxBytes) {
  HistorySnapshot snapshot;
  const std::string head = "{\"version\":" + std::to_string(kHistoryFileVersion) + ",\"jobs\":{";
  const std::string tail = "}}\n";
  std::string jobs;
  for (const std::string& runId : core.jobIds()) {
    const std::string entry = jobEntry(core, runId);
    const auto name = jsonString(runId);
    if (entry.empty() || !name) continue;
    const std::string item = (jobs.empty() ? "" : ",") + *name + ':' + entry;
    if (head.size() + jobs.size() + item.size() + tail.size() > maxBytes) {
      snapshot.leftOut.push_back(runId);
      continue;
    }
    jobs += item;
  }
  snapshot.text = head + jobs + tail;
  return snapshot;
}

std::vector<JobHistoryKeys> parseHistory(std::string_view text) {
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) invalid("not JSON (truncated or corrupt)");
  if (!doc.is_object()) invalid("not a JSON object");
  const auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer() || *version != kHistoryFileVersion)
    invalid("\"version\" is not " + std::to_string(kHistoryFileVersion));
  const auto jobs = doc.find("jobs");
  if (jobs == doc.end() || !jobs->is_object()) invalid("no \"jobs\" object");
  std::vector<JobHistoryKeys> result;
  for (const auto& job : jobs->items()) {
    const std::string& runId = job.key();
    const nlohmann::json& fields = job.value();
    try {
      keys::validateRunId(runId);
    } catch (const Error&) {  // its message repeats the id unescaped
      invalid("job " + quoted(runId) + ": not a run id (1 to 128 letters, digits and _.:@+-)");
    }
    if (!fields.is_object()) invalid("job " + runId + ": not an object");
    JobHistoryKeys kept{runId, {}};
    for (const auto& field : fields.items()) {
      const std::string& name = field.key();
      const nlohmann::json& value = field.value();
      if (!isKeptName(name)) invalid("job " + runId + ": key " + quoted(name) + " is not kept history");
      if (!value.is_string()) invalid("job " + runId + ": " + name + " is not a string");
      const std::string& bytes = value.get_ref<const std::string&>();
      if ((name == kEventNext || name == kRound) && !isDecimal(bytes))
        invalid("job " + runId + ": " + name + " is not a decimal counter");
      if (bytes.size() > kStoreLimits.maxValueBytes) invalid("job " + runId + ": " + name + " is too long");
      kept.entries.emplace_back(keys::job(runId) + name, bytes);
    }
    if (fields.contains(std::string(kRound)) && !fields.contains(std::string(kOutcome)))
      invalid("job " + runId + ": a round without an outcome (a running job's round is never kept)");
    result.push_back(std::move(kept));
  }
  return result;
}

}  // namespace drun::rdzv::state

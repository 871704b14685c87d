#include "drun/agent/flight_trace.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "drun/agent/failure_summary.hpp"
#include "drun/common/error.hpp"

namespace drun::agent {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr size_t kMaxFlightFiles = 4096;
constexpr size_t kMaxFlightText = 64;       // bytes of a group, op, dtype or state
constexpr size_t kMaxFlightJsonDepth = 16;  // a record is 3 levels deep
constexpr size_t kMaxFindingsShown = 32;

[[noreturn]] void malformed(const fs::path& file, const std::string& why) {
  throw Error("flight record " + file.string() + " is malformed: " + why);
}

// A short printable string field of `object`.
std::string text(const json& object, const char* name, const fs::path& file) {
  auto it = object.find(name);
  if (it == object.end() || !it->is_string()) malformed(file, std::string("\"") + name + "\" is missing or not a string");
  std::string value = it->get<std::string>();
  if (value.size() > kMaxFlightText) malformed(file, std::string("\"") + name + "\" is longer than 64 bytes");
  for (unsigned char c : value)
    if (c < 0x20 || c >= 0x7f) malformed(file, std::string("\"") + name + "\" is not printable");
  return value;
}

int64_t number(const json& object, const char* name, const fs::path& file, int64_t min) {
  auto it = object.find(name);
  if (it == object.end() || !it->is_number_integer()) malformed(file, std::string("\"") + name + "\" is missing or not an integer");
  const int64_t value = it->get<int64_t>();
  if (value < min) malformed(file, std::string("\"") + name + "\" is " + std::to_string(value));
  return value;
}

std::string describeEntry(const FlightEntry& e) {
  return e.op + " #" + std::to_string(e.seq) + " of group " + e.group;
}

std::string shape(const FlightEntry& e) { return e.op + " " + e.dtype + " x" + std::to_string(e.count); }

void addCapped(std::vector<std::string>& to, std::string line, size_t& dropped) {
  if (to.size() < kMaxFindingsShown) to.push_back(std::move(line));
  else ++dropped;
}

}  // namespace

FlightRecord readFlightRecord(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error("flight record " + file.string() + " cannot be read");
  std::string content(kMaxFlightRecordBytes + 1, '\0');
  in.read(content.data(), static_cast<std::streamsize>(content.size()));
  content.resize(static_cast<size_t>(in.gcount()));
  if (content.size() > kMaxFlightRecordBytes) malformed(file, "larger than 1 MiB");
  if (content.find_first_not_of(" \t\r\n") == std::string::npos) malformed(file, "empty");
  if (jsonNestingDepth(content) > kMaxFlightJsonDepth) malformed(file, "JSON nested too deep");
  json doc;
  try {
    doc = json::parse(content);
  } catch (const json::exception&) {
    malformed(file, "not JSON (truncated?)");
  }
  if (!doc.is_object()) malformed(file, "not a JSON object");
  if (number(doc, "version", file, 1) != 1) malformed(file, "unknown \"version\"");
  FlightRecord r;
  r.file = file;
  r.worldSize = static_cast<int>(std::min<int64_t>(number(doc, "world_size", file, 1), 1 << 24));
  r.rank = static_cast<int>(std::min<int64_t>(number(doc, "rank", file, 0), 1 << 24));
  if (r.rank >= r.worldSize) malformed(file, "\"rank\" is not below \"world_size\"");
  r.pid = number(doc, "pid", file, 0);
  r.reason = text(doc, "reason", file);
  auto entries = doc.find("entries");
  if (entries == doc.end() || !entries->is_array()) malformed(file, "\"entries\" is missing or not an array");
  if (entries->size() > kMaxFlightEntries) malformed(file, "more than 4096 entries");
  for (const json& e : *entries) {
    if (!e.is_object()) malformed(file, "an entry is not an object");
    FlightEntry x;
    x.group = text(e, "group", file);
    x.seq = static_cast<uint64_t>(number(e, "seq", file, 0));
    x.op = text(e, "op", file);
    x.dtype = text(e, "dtype", file);
    x.state = text(e, "state", file);
    x.count = number(e, "count", file, 0);
    x.queuedNs = number(e, "queued_ns", file, 0);
    x.startNs = number(e, "start_ns", file, 0);
    x.endNs = number(e, "end_ns", file, 0);
    r.entries.push_back(std::move(x));
  }
  return r;
}

std::vector<FlightRecord> readFlightRecords(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw Error(dir.string() + " is not a directory");
  std::vector<fs::path> files;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
  if (ec) throw Error("cannot read " + dir.string() + ": " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) throw Error("cannot read " + dir.string() + ": " + ec.message());
    if (it.depth() >= 3) it.disable_recursion_pending();
    const std::string name = it->path().filename().string();
    if (name.rfind(kFlightRecordPrefix, 0) != 0 || it->path().extension() != ".json") continue;
    if (!it->is_regular_file(ec)) continue;
    if (files.size() == kMaxFlightFiles) throw Error(dir.string() + " holds more than 4096 flight records");
    files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  std::vector<FlightRecord> records;
  for (const fs::path& f : files) records.push_back(readFlightRecord(f));
  std::sort(records.begin(), records.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  return records;
}

FlightFindings analyzeFlightRecords(const std::vector<FlightRecord>& records) {
  FlightFindings out;
  size_t dropped = 0;
  // Per group: each rank's entries by sequence number.
  std::map<std::string, std::map<int, std::map<uint64_t, const FlightEntry*>>> groups;
  std::set<int> ranks;
  int worldSize = 0;
  for (const FlightRecord& r : records) {
    ranks.insert(r.rank);
    worldSize = std::max(worldSize, r.worldSize);
    for (const FlightEntry& e : r.entries) groups[e.group][r.rank][e.seq] = &e;
  }
  for (int rank = 0; rank < worldSize && rank < (1 << 16); ++rank)
    if (!ranks.count(rank)) addCapped(out.missing, "no record from rank " + std::to_string(rank), dropped);
  for (const auto& [group, byRank] : groups) {
    // The furthest any rank got in this group, and what that collective was.
    uint64_t furthest = 0;
    for (const auto& [rank, entries] : byRank) furthest = std::max(furthest, entries.rbegin()->first);
    for (int rank : ranks) {
      auto mine = byRank.find(rank);
      const uint64_t last = mine == byRank.end() ? 0 : mine->second.rbegin()->first;
      if (mine != byRank.end() && last >= furthest) continue;
      // The first collective it never entered, as the ranks that did recorded it.
      const FlightEntry* next = nullptr;
      for (auto other = byRank.begin(); other != byRank.end() && !next; ++other)
        if (auto e = other->second.find(last + 1); e != other->second.end()) next = e->second;
      std::string line = "rank " + std::to_string(rank) + " never entered " +
                         (next ? describeEntry(*next) : "#" + std::to_string(last + 1) + " of group " + group);
      if (mine != byRank.end()) {
        const FlightEntry& e = *mine->second.rbegin()->second;
        line += " (its last: " + describeEntry(e) + ", " + e.state + ")";
      }
      addCapped(out.neverEntered, line, dropped);
    }
    // Where the ranks that entered a collective disagree on what it is.
    std::map<uint64_t, std::vector<std::pair<int, const FlightEntry*>>> bySeq;
    for (const auto& [rank, entries] : byRank)
      for (const auto& [seq, e] : entries) bySeq[seq].emplace_back(rank, e);
    for (const auto& [seq, entered] : bySeq) {
      const bool same = std::all_of(entered.begin(), entered.end(), [&](const auto& x) { return shape(*x.second) == shape(*entered[0].second); });
      if (same) continue;
      std::string line = "group " + group + " #" + std::to_string(seq) + ":";
      for (size_t i = 0; i < entered.size() && i < 8; ++i)
        line += std::string(i ? "," : "") + " rank " + std::to_string(entered[i].first) + " " + shape(*entered[i].second);
      if (entered.size() > 8) line += ", ...";
      addCapped(out.disagree, line, dropped);
    }
  }
  if (dropped) out.missing.push_back("... and " + std::to_string(dropped) + " more findings");
  return out;
}

std::string describeFlightFindings(const std::vector<FlightRecord>& records, const FlightFindings& f) {
  std::ostringstream out;
  out << records.size() << " flight record(s)";
  if (f.empty()) {
    out << "; the records agree: every rank entered the same collectives";
    return out.str();
  }
  for (const auto& line : f.neverEntered) out << "\n" << line;
  for (const auto& line : f.disagree) out << "\n" << "the records disagree: " << line;
  for (const auto& line : f.missing) out << "\n" << line;
  return out.str();
}

}  // namespace drun::agent

#include "drun/rendezvous/keys.hpp"

#include <charconv>
#include <unordered_set>

#include "drun/common/error.hpp"

namespace drun::rdzv::keys {
namespace {

constexpr size_t kMaxField = 255;
constexpr int kMaxLocalWorldSize = 1 << 20;
constexpr int kMaxNodeRank = 1 << 20;

std::string cat(std::string_view a, std::string_view b) {
  std::string s;
  s.reserve(a.size() + b.size());
  s.append(a).append(b);
  return s;
}

// Splits on '\t'; keeps empty fields.
std::vector<std::string_view> splitTabs(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    size_t tab = s.find('\t', start);
    if (tab == std::string_view::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, tab - start));
    start = tab + 1;
  }
}

template <typename Int>
std::optional<Int> parseInt(std::string_view s) {
  Int v{};
  if (s.empty()) return std::nullopt;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

bool isPlainField(std::string_view s) {
  if (s.empty() || s.size() > kMaxField) return false;
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f) return false;  // tabs, newlines and other controls
  return true;
}

}  // namespace

void validateRunId(std::string_view runId) {
  bool ok = !runId.empty() && runId.size() <= 128;
  for (char c : runId) {
    bool allowed = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                   c == '_' || c == '.' || c == ':' || c == '@' || c == '+' || c == '-';
    ok = ok && allowed;
  }
  if (!ok)
    throw InvalidArgument("invalid --rdzv-id '" + std::string(runId) +
                          "': use 1 to 128 characters of letters, digits and _.:@+-");
}

bool isValidNodeId(std::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    bool allowed = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                   c == '_' || c == '-';
    if (!allowed) return false;
  }
  return true;
}

std::string job(std::string_view runId) { return "rdzv/" + std::string(runId) + "/"; }
std::string currentRound(std::string_view runId) { return cat(job(runId), "round"); }
std::string attached(std::string_view runId) { return cat(job(runId), "attached"); }
std::string round(std::string_view runId, uint64_t round) {
  return job(runId) + std::to_string(round) + "/";
}

std::string joined(std::string_view runId, uint64_t r) { return cat(round(runId, r), "joined"); }
std::string count(std::string_view runId, uint64_t r) { return cat(round(runId, r), "count"); }
std::string status(std::string_view runId, uint64_t r) { return cat(round(runId, r), "status"); }
std::string state(std::string_view runId, uint64_t r) { return cat(round(runId, r), "state"); }
std::string lastCall(std::string_view runId, uint64_t r) {
  return cat(round(runId, r), "lastcall");
}
std::string dead(std::string_view runId, uint64_t r, std::string_view node) {
  return cat(round(runId, r), cat("dead/", node));
}
std::string changes(std::string_view runId, uint64_t r) { return cat(round(runId, r), "changes"); }
std::string lastChange(std::string_view runId, uint64_t r) {
  return cat(round(runId, r), "last_change");
}
std::string reeval(std::string_view runId, uint64_t r, std::string_view statusValue) {
  return cat(round(runId, r), cat("reeval/", statusValue));
}
std::string assign(std::string_view runId, uint64_t r, std::string_view closer,
                   std::string_view node) {
  return cat(round(runId, r), "assign/" + std::string(closer) + "/" + std::string(node));
}
std::string hosts(std::string_view runId, uint64_t r, std::string_view closer) {
  return cat(round(runId, r), cat("hosts/", closer));
}

std::string NodeDescriptor::displayName() const {
  return host == addr ? host : host + "(" + addr + ")";
}

std::string encodeDescriptor(const NodeDescriptor& node) {
  if (!isValidNodeId(node.id)) throw InvalidArgument("invalid node id '" + node.id + "'");
  if (!isPlainField(node.host)) throw InvalidArgument("invalid host name '" + node.host + "'");
  if (!isPlainField(node.addr)) throw InvalidArgument("invalid node address '" + node.addr + "'");
  if (node.localWorldSize < 1 || node.localWorldSize > kMaxLocalWorldSize)
    throw InvalidArgument("local world size " + std::to_string(node.localWorldSize) +
                          " out of range");
  if (node.requestedRank && (*node.requestedRank < 0 || *node.requestedRank > kMaxNodeRank))
    throw InvalidArgument("node rank " + std::to_string(*node.requestedRank) + " out of range");
  std::string line;
  line.append(node.id).append("\t").append(node.host).append("\t").append(node.addr);
  line.append("\t").append(std::to_string(node.localWorldSize)).append("\t");
  line.append(node.requestedRank ? std::to_string(*node.requestedRank) : "-");
  line.append("\t").append(std::to_string(node.masterPort)).append("\n");
  return line;
}

std::vector<NodeDescriptor> parseJoined(std::string_view blob, size_t* skipped) {
  std::vector<NodeDescriptor> nodes;
  std::unordered_set<std::string_view> seen;
  size_t bad = 0;
  size_t start = 0;
  while (start < blob.size()) {
    size_t nl = blob.find('\n', start);
    if (nl == std::string_view::npos) {  // a torn last line: not a whole descriptor
      ++bad;
      break;
    }
    std::string_view line = blob.substr(start, nl - start);
    start = nl + 1;
    auto f = splitTabs(line);
    NodeDescriptor d;
    std::optional<int> lws, rank;
    std::optional<uint16_t> port;
    bool ok = f.size() == 6 && isValidNodeId(f[0]) && isPlainField(f[1]) && isPlainField(f[2]) &&
              (lws = parseInt<int>(f[3])) && *lws >= 1 && *lws <= kMaxLocalWorldSize &&
              (port = parseInt<uint16_t>(f[5]));
    if (ok && f[4] != "-") {
      rank = parseInt<int>(f[4]);
      ok = rank && *rank >= 0 && *rank <= kMaxNodeRank;
    }
    if (!ok) {
      ++bad;
      continue;
    }
    if (!seen.insert(f[0]).second) continue;  // a duplicate line of the same node
    d.id = std::string(f[0]);
    d.host = std::string(f[1]);
    d.addr = std::string(f[2]);
    d.localWorldSize = *lws;
    d.requestedRank = rank;
    d.masterPort = *port;
    d.arrival = nodes.size();
    nodes.push_back(std::move(d));
  }
  if (skipped) *skipped = bad;
  return nodes;
}

std::string encodeState(const RoundState& s) {
  if (!s.ok) {
    std::string msg = s.error;
    for (char& c : msg)
      if (c == '\n') c = ' ';
    return "error\t" + msg;
  }
  return "ok\t" + s.closer + "\t" + std::to_string(s.nodeCount) + "\t" +
         std::to_string(s.worldSize) + "\t" + s.masterAddr + "\t" + std::to_string(s.masterPort) +
         "\t" + std::to_string(s.changesAtClose);
}

std::optional<RoundState> parseState(std::string_view value) {
  RoundState s;
  if (value.starts_with("error\t")) {
    s.ok = false;
    s.error = std::string(value.substr(6));
    return s;
  }
  if (!value.starts_with("ok\t")) {
    if (parseInt<int64_t>(value)) return std::nullopt;  // the open round's event counter
    throw ProtocolError("corrupt rendezvous state '" + std::string(value.substr(0, 80)) + "'");
  }
  auto f = splitTabs(value);
  std::optional<int> nodes, world;
  std::optional<uint16_t> port;
  std::optional<int64_t> changes;
  if (f.size() != 7 || !isValidNodeId(f[1]) || !(nodes = parseInt<int>(f[2])) || *nodes < 1 ||
      !(world = parseInt<int>(f[3])) || *world < *nodes || !isPlainField(f[4]) ||
      !(port = parseInt<uint16_t>(f[5])) || !(changes = parseInt<int64_t>(f[6])))
    throw ProtocolError("corrupt rendezvous state '" + std::string(value.substr(0, 80)) + "'");
  s.closer = std::string(f[1]);
  s.nodeCount = *nodes;
  s.worldSize = *world;
  s.masterAddr = std::string(f[4]);
  s.masterPort = *port;
  s.changesAtClose = *changes;
  return s;
}

std::string encodeAssignment(const Assignment& a) {
  return std::to_string(a.nodeRank) + "\t" + std::to_string(a.rankOffset);
}

Assignment parseAssignment(std::string_view value) {
  auto f = splitTabs(value);
  std::optional<int> rank, offset;
  if (f.size() != 2 || !(rank = parseInt<int>(f[0])) || *rank < 0 ||
      !(offset = parseInt<int>(f[1])) || *offset < 0)
    throw ProtocolError("corrupt rank assignment '" + std::string(value.substr(0, 80)) + "'");
  return {*rank, *offset};
}

std::optional<int64_t> parseCounter(const std::optional<std::string>& value) {
  if (!value) return std::nullopt;
  auto v = parseInt<int64_t>(*value);
  if (!v) throw ProtocolError("corrupt counter value '" + value->substr(0, 80) + "'");
  return v;
}

}  // namespace drun::rdzv::keys

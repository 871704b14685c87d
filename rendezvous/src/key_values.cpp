// The key scheme's values: node descriptors, round states, assignments, endings, failure
// records, outcomes and the job's configuration, each encoded and parsed back strictly.
#include "drun/rendezvous/keys.hpp"

#include <unordered_set>

#include "drun/common/error.hpp"
#include "drun/common/fnv1a.hpp"
#include "drun/common/safe_text.hpp"
#include "key_text.hpp"

namespace drun::rdzv::keys {

using namespace detail;

std::string NodeDescriptor::displayName() const {
  return host == addr ? host : host + "(" + addr + ")";
}

std::string encodeDescriptor(const NodeDescriptor& node) {
  if (!isValidNodeId(node.id)) throw InvalidArgument("invalid node id '" + node.id + "'");
  if (!isPlainField(node.host)) throw InvalidArgument("invalid host name '" + node.host + "'");
  if (!isHostOrAddress(node.addr))
    throw InvalidArgument("invalid node address '" + text::printable(node.addr, {kMaxField}) +
                          "': not a host name or an IP address");
  if (node.localWorldSize < 1 || node.localWorldSize > kMaxLocalWorldSize)
    throw InvalidArgument("local world size " + std::to_string(node.localWorldSize) +
                          " out of range");
  if (node.requestedRank && (*node.requestedRank < 0 || *node.requestedRank > kMaxNodeRank))
    throw InvalidArgument("node rank " + std::to_string(*node.requestedRank) + " out of range");
  std::string line;
  line.append(node.id).append("\t").append(node.host).append("\t").append(node.addr);
  line.append("\t").append(std::to_string(node.localWorldSize)).append("\t");
  line.append(node.requestedRank ? std::to_string(*node.requestedRank) : "-");
  line.append("\t").append(std::to_string(node.masterPort));
  if (node.previousRank && (*node.previousRank < 0 || *node.previousRank > kMaxNodeRank))
    throw InvalidArgument("node rank " + std::to_string(*node.previousRank) + " out of range");
  line.append(!node.rejoining ? "\t-" : node.previousRank ? "\tm" + std::to_string(*node.previousRank) : "\tm");
  line.append("\n");
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
    std::optional<int> lws, rank, previous;
    std::optional<uint16_t> port;
    bool ok = f.size() == 7 && !f[6].empty() && (f[6][0] == 'm' || f[6] == "-") && isValidNodeId(f[0]) && isPlainField(f[1]) && isHostOrAddress(f[2]) &&
              (lws = parseInt<int>(f[3])) && *lws >= 1 && *lws <= kMaxLocalWorldSize &&
              (port = parseInt<uint16_t>(f[5]));
    if (ok && f[4] != "-") {
      rank = parseInt<int>(f[4]);
      ok = rank && *rank >= 0 && *rank <= kMaxNodeRank;
    }
    if (ok && f[6].size() > 1) {
      previous = parseInt<int>(f[6].substr(1));
      ok = previous && *previous >= 0 && *previous <= kMaxNodeRank;
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
    d.rejoining = f[6][0] == 'm';
    d.previousRank = previous;
    d.arrival = nodes.size();
    nodes.push_back(std::move(d));
  }
  if (skipped) *skipped = bad;
  return nodes;
}

namespace {

std::string hex64(uint64_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) out[static_cast<size_t>(i)] = kDigits[v & 0xf];
  return out;
}

std::optional<uint64_t> parseHex64(std::string_view s) {
  if (s.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return v;
}

}  // namespace

// FNV-1a over every node rank's id and local world size: not a secret, an identity check.
uint64_t rosterDigest(const std::vector<RosterEntry>& roster) {
  Fnv1a h;
  for (const RosterEntry& e : roster) h.mix(e.id).mix("\t").mix(std::to_string(e.localWorldSize)).mix("\n");
  return h.value;
}

std::string encodeState(const RoundState& s, bool withRoster) {
  if (!s.ok) {
    std::string msg = s.error;
    for (char& c : msg)
      if (c == '\n' || c == '\t') c = ' ';
    return "error\t" + msg;
  }
  std::string out = "ok\t" + std::to_string(s.nodeCount) + "\t" + std::to_string(s.worldSize) +
                    "\t" + s.masterAddr + "\t" + std::to_string(s.masterPort) + "\t" +
                    std::to_string(s.changesAtClose) + "\t" + std::to_string(s.leftAtClose) +
                    "\t" + std::to_string(s.restartCount) + "\t" +
                    hex64(s.roster.empty() ? s.rosterDigest : rosterDigest(s.roster)) + "\n";
  if (!withRoster) return out;
  out.reserve(out.size() + s.roster.size() * 24);
  for (const auto& e : s.roster)
    out.append(e.id).append("\t").append(e.name).append("\t")
        .append(std::to_string(e.localWorldSize)).append("\n");
  return out;
}

std::optional<RoundState> parseState(std::string_view value) {
  RoundState s;
  if (value.starts_with("error\t")) {
    s.ok = false;
    s.error = text::printable(value.substr(6), {kMaxStateError});
    return s;
  }
  auto corrupt = [&] {
    return ProtocolError("corrupt rendezvous state '" + text::printable(value.substr(0, 80)) +
                         "'");
  };
  if (!value.starts_with("ok\t")) {
    if (parseInt<int64_t>(value)) return std::nullopt;  // the open round's event counter
    throw corrupt();
  }
  size_t nl = value.find('\n');
  if (nl == std::string_view::npos) throw corrupt();
  auto f = splitTabs(value.substr(0, nl));
  std::optional<int> nodes, world;
  std::optional<uint16_t> port;
  std::optional<int64_t> changes, left;
  std::optional<int> restarts;
  std::optional<uint64_t> digest;
  // MASTER_ADDR goes to every worker (torch connects to it and unpickles what it serves): a host
  // name or an address, nothing else. Counts are within what a round can hold.
  if (f.size() != 9 || !(nodes = parseInt<int>(f[1])) || *nodes < 1 || *nodes > kMaxNodes ||
      !(world = parseInt<int>(f[2])) || *world < *nodes ||
      int64_t{*world} > int64_t{*nodes} * kMaxLocalWorldSize || !isHostOrAddress(f[3]) ||
      !(port = parseInt<uint16_t>(f[4])) || !(changes = parseInt<int64_t>(f[5])) ||
      *changes < 0 || !(left = parseInt<int64_t>(f[6])) || *left < 0 ||
      !(restarts = parseInt<int>(f[7])) || *restarts < 0 || !(digest = parseHex64(f[8])))
    throw corrupt();
  s.nodeCount = *nodes;
  s.worldSize = *world;
  s.masterAddr = std::string(f[3]);
  s.masterPort = *port;
  s.changesAtClose = *changes;
  s.leftAtClose = *left;
  s.restartCount = *restarts;
  s.rosterDigest = *digest;
  int64_t sum = 0;
  for (size_t start = nl + 1; start < value.size();) {
    size_t end = value.find('\n', start);
    if (end == std::string_view::npos) throw corrupt();
    auto e = splitTabs(value.substr(start, end - start));
    std::optional<int> lws;
    if (e.size() != 3 || !isValidNodeId(e[0]) || !isPlainField(e[1], kMaxName) ||
        !(lws = parseInt<int>(e[2])) || *lws < 1 || *lws > kMaxLocalWorldSize)
      throw corrupt();
    s.roster.push_back({std::string(e[0]), std::string(e[1]), *lws});
    sum += *lws;
    start = end + 1;
  }
  if (!s.roster.empty() && (static_cast<int>(s.roster.size()) != s.nodeCount || sum != s.worldSize ||
                            rosterDigest(s.roster) != s.rosterDigest))
    throw corrupt();
  return s;
}

std::string encodeAssignment(const Assignment& a) {
  return std::to_string(a.nodeRank) + "\t" + std::to_string(a.rankOffset);
}

Assignment parseAssignment(std::string_view value) {
  auto f = splitTabs(value);
  std::optional<int> rank, offset;
  if (f.size() != 2 || !(rank = parseInt<int>(f[0])) || *rank < 0 || *rank > kMaxNodeRank ||
      !(offset = parseInt<int>(f[1])) || *offset < 0)
    throw ProtocolError("corrupt rank assignment '" + text::printable(value.substr(0, 80)) + "'");
  return {*rank, *offset};
}


namespace {
constexpr std::string_view kEndingFinish = "finish", kEndingScaleUp = "scale-up";
}  // namespace

std::string encodeEnding(RoundEnding ending) {
  switch (ending) {
    case RoundEnding::Open: return "";
    case RoundEnding::Finish: return std::string(kEndingFinish);
    case RoundEnding::ScaleUp: return std::string(kEndingScaleUp);
  }
  return "";
}

RoundEnding parseEnding(const std::optional<std::string>& value) {
  if (!value) return RoundEnding::Open;
  if (*value == kEndingFinish) return RoundEnding::Finish;
  if (*value == kEndingScaleUp) return RoundEnding::ScaleUp;
  throw ProtocolError("corrupt round ending '" + text::printable(value->substr(0, 80)) +
                      "' (expected '" + std::string(kEndingFinish) + "' or '" +
                      std::string(kEndingScaleUp) + "')");
}

std::optional<int64_t> parseCounter(const std::optional<std::string>& value) {
  if (!value) return std::nullopt;
  auto v = parseInt<int64_t>(*value);
  if (!v) throw ProtocolError("corrupt counter value '" + text::printable(value->substr(0, 80)) + "'");
  return v;
}

std::string encodeFailure(const FailureRecord& f) {
  auto plain = [](const std::string& field, const char* fallback) {
    std::string out = field.substr(0, kMaxField);
    for (char& c : out)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
    return out.empty() ? std::string(fallback) : out;
  };
  std::string out;
  for (int64_t v : {int64_t{f.rank}, int64_t{f.localRank}, int64_t{f.exitCode}, int64_t{f.signal},
                    f.pid, f.timeMs, int64_t{f.final ? 1 : 0}, int64_t{f.otherFailures}})
    out.append(std::to_string(v)).append("\t");
  out.append(plain(f.node, "?")).append("\t").append(plain(f.detailSource, "-")).append("\n");
  out.append(f.detail.substr(0, kMaxFailureDetail));
  return out;
}

FailureRecord parseFailure(std::string_view value) {
  auto corrupt = [&] {
    return ProtocolError("corrupt failure record in the store: '" +
                         text::printable(value.substr(0, 80)) + "'");
  };
  size_t nl = value.find('\n');
  if (nl == std::string_view::npos || value.size() - nl - 1 > kMaxFailureDetail) throw corrupt();
  auto f = splitTabs(value.substr(0, nl));
  if (f.size() != 10 || !isPlainField(f[8], kMaxName) || !isPlainField(f[9], kMaxName))
    throw corrupt();
  FailureRecord r;
  std::optional<int> rank, local, code, signal, final, others;
  std::optional<int64_t> pid, time;
  if (!(rank = parseInt<int>(f[0])) || !(local = parseInt<int>(f[1])) ||
      !(code = parseInt<int>(f[2])) || *code < -1 || *code > 255 ||
      !(signal = parseInt<int>(f[3])) || *signal < 0 || *signal > 255 ||
      !(pid = parseInt<int64_t>(f[4])) || *pid < 0 || !(time = parseInt<int64_t>(f[5])) ||
      !(final = parseInt<int>(f[6])) || (*final != 0 && *final != 1) ||
      !(others = parseInt<int>(f[7])) || *others < 0)
    throw corrupt();
  r.rank = *rank;
  r.localRank = *local;
  r.exitCode = *code;
  r.signal = *signal;
  r.pid = *pid;
  r.timeMs = *time;
  r.final = *final == 1;
  r.otherFailures = *others;
  r.node = std::string(f[8]);
  if (f[9] != "-") r.detailSource = std::string(f[9]);
  // Another node's worker wrote it (its stderr, its error file): printed on every node's terminal.
  r.detail = text::printable(value.substr(nl + 1), {kMaxFailureDetail, /*multiLine=*/true});
  return r;
}

std::string encodeOutcome(const std::optional<FailureRecord>& failure) {
  return failure ? "failed\n" + encodeFailure(*failure) : std::string("succeeded");
}

std::string encodeOutcomeReset(std::string_view node) {
  return "resetting\t" + std::string(node);
}

bool isOutcomeReset(std::string_view value) { return value.starts_with("resetting\t"); }

std::optional<FailureRecord> parseOutcome(std::string_view value) {
  if (value == "succeeded") return std::nullopt;
  if (value.starts_with("failed\n")) return parseFailure(value.substr(7));
  throw ProtocolError("corrupt job outcome in the store: '" + text::printable(value.substr(0, 80)) +
                      "'");
}


std::string encodeJobConfig(const JobConfig& config) {
  if (!isPlainField(config.setBy)) throw InvalidArgument("invalid node name '" + config.setBy + "'");
  return std::to_string(config.minNodes) + "\t" + std::to_string(config.maxNodes) + "\t" +
         config.setBy + "\t" + std::to_string(config.maxRestarts) + "\n";
}

JobConfig parseJobConfig(std::string_view value) {
  auto f = splitTabs(value.substr(0, value.find('\n')));
  JobConfig c;
  std::optional<int> lo, hi, restarts;
  if (f.size() != 4 || !value.ends_with('\n') || !(lo = parseInt<int>(f[0])) ||
      !(hi = parseInt<int>(f[1])) || *lo < 1 || *hi < *lo || !isPlainField(f[2]) ||
      !(restarts = parseInt<int>(f[3])) || *restarts < 0)
    throw ProtocolError("malformed job settings in the store: '" + text::printable(value.substr(0, 80)) + "'");
  c.minNodes = *lo;
  c.maxNodes = *hi;
  c.setBy = std::string(f[2]);
  c.maxRestarts = *restarts;
  return c;
}


}  // namespace drun::rdzv::keys

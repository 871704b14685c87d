#include "drun/rendezvous/keys.hpp"

#include <arpa/inet.h>

#include <charconv>
#include <unordered_set>

#include "drun/common/error.hpp"
#include "drun/common/safe_text.hpp"

namespace drun::rdzv::keys {
namespace {

constexpr size_t kMaxField = 255;
// NodeDescriptor::displayName(): "host(addr)", each a plain field.
constexpr size_t kMaxName = 2 * kMaxField + 2;
constexpr int kMaxLocalWorldSize = 1 << 20;
constexpr int kMaxNodeRank = 1 << 20;
// A round has at most one node per possible node rank; a state claiming more is corrupt (and
// would make its readers allocate per claimed node).
constexpr int kMaxNodes = kMaxNodeRank + 1;

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

bool isPlainField(std::string_view s, size_t maxSize = kMaxField) {
  if (s.empty() || s.size() > maxSize) return false;
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f) return false;  // tabs, newlines and other controls
  return true;
}

// A round's error text is told to every joiner and printed: one bounded, printable line.
constexpr size_t kMaxStateError = 4096;

}  // namespace

bool isHostOrAddress(std::string_view s) {
  if (s.empty() || s.size() > 253 + 1) return false;
  std::string text(s);
  unsigned char binary[16];
  if (::inet_pton(AF_INET, text.c_str(), binary) == 1) return true;
  if (::inet_pton(AF_INET6, text.c_str(), binary) == 1) return true;
  // A host name (RFC 1123; '_' tolerated, as resolvers do): dot-separated labels of 1 to 63
  // letters, digits, '-' and '_', not starting or ending with '-'; one trailing dot allowed.
  if (s.back() == '.') s.remove_suffix(1);
  if (s.empty() || s.size() > 253) return false;
  size_t start = 0;
  for (;;) {
    size_t dot = s.find('.', start);
    std::string_view label = s.substr(start, dot == std::string_view::npos ? s.npos : dot - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-')
      return false;
    for (char c : label) {
      bool allowed = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                     (c >= '0' && c <= '9') || c == '-' || c == '_';
      if (!allowed) return false;
    }
    if (dot == std::string_view::npos) return true;
    start = dot + 1;
  }
}

void validateRunId(std::string_view runId) {
  bool ok = !runId.empty() && runId.size() <= 128;
  for (char c : runId) {
    bool allowed = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                   c == '_' || c == '.' || c == ':' || c == '@' || c == '+' || c == '-';
    ok = ok && allowed;
  }
  ok = ok && runId != "." && runId != "..";  // a run id names a directory under --log-dir too
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
std::string assign(std::string_view runId, uint64_t r, std::string_view node) {
  return cat(round(runId, r), cat("assign/", node));
}
std::string hosts(std::string_view runId, uint64_t r) { return cat(round(runId, r), "hosts"); }
std::string left(std::string_view runId, uint64_t r) { return cat(round(runId, r), "left"); }
std::string lost(std::string_view runId, uint64_t r) { return cat(round(runId, r), "lost"); }
std::string rejoined(std::string_view runId, uint64_t r) {
  return cat(round(runId, r), "rejoined");
}
std::string waiting(std::string_view runId, uint64_t r) { return cat(round(runId, r), "waiting"); }
std::string finished(std::string_view runId, uint64_t r) {
  return cat(round(runId, r), "finished");
}
std::string ending(std::string_view runId, uint64_t r) { return cat(round(runId, r), "ending"); }
std::string failure(std::string_view runId, uint64_t r) { return cat(round(runId, r), "failure"); }
std::string outcome(std::string_view runId) { return cat(job(runId), "outcome"); }
std::string config(std::string_view runId) { return cat(job(runId), "config"); }
std::string present(std::string_view runId) { return cat(job(runId), "present"); }
std::string refill(std::string_view runId) { return cat(job(runId), "refill"); }
std::string lastDead(std::string_view runId, uint64_t r) { return cat(round(runId, r), "last_dead"); }
std::string eventCount(std::string_view runId) { return cat(job(runId), "events/next"); }
std::string eventSlot(std::string_view runId, uint64_t n) {
  return cat(job(runId), "events/" + std::to_string(n % kEventSlots));
}
std::optional<std::string> runIdOfEventSlot(std::string_view key) {
  constexpr std::string_view kRoot = "rdzv/", kEvents = "/events/";
  if (!key.starts_with(kRoot)) return std::nullopt;
  const size_t at = key.rfind(kEvents);
  if (at == std::string_view::npos || at <= kRoot.size()) return std::nullopt;
  std::string_view slot = key.substr(at + kEvents.size());
  if (slot.empty() || slot.size() > 4) return std::nullopt;
  for (char c : slot)
    if (c < '0' || c > '9') return std::nullopt;
  std::string runId(key.substr(kRoot.size(), at - kRoot.size()));
  if (runId.find('/') != std::string::npos) return std::nullopt;
  return runId;
}
std::string sharedValue(std::string_view runId, std::string_view name) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string key = cat(job(runId), "shared/");
  for (unsigned char c : name.substr(0, 128)) key.append({kHex[c >> 4], kHex[c & 15]});
  return key;
}

namespace {

// What every will of a node in round r says: its dead flag, why (for the watchers' messages),
// and its id as the latest death.
std::vector<std::pair<std::string, Bytes>> deathNotice(std::string_view runId, uint64_t r,
                                                        std::string_view node, std::string why) {
  return {{dead(runId, r, node), "1"}, {lastChange(runId, r), std::move(why)},
          {lastDead(runId, r), std::string(node)}};
}

}  // namespace

Store::Will joinWill(std::string_view runId, uint64_t r, std::string_view node,
                     std::string_view displayName, bool rejoining) {
  Store::Will will;
  will.sets = deathNotice(runId, r, node,
                          "node " + std::string(displayName) + " left round " + std::to_string(r) +
                              " (its connection to the rendezvous store closed or went silent)");
  // status last: once the round is closed it holds the state, and the store skips that add.
  will.adds = {{left(runId, r), 1},
               {lost(runId, r), 1},
               {changes(runId, r), 1},
               {status(runId, r), 1},
               {status(runId, r + 1), 1},
               {present(runId), -1}};
  if (rejoining && r > 0) will.adds.insert(will.adds.begin(), {left(runId, r - 1), 1});
  return will;
}

Store::Will presenceWill(std::string_view runId) {
  Store::Will will;
  will.adds = {{present(runId), -1}};
  return will;
}

Store::Will finishedWill(std::string_view runId, uint64_t r, std::string_view node,
                         std::string_view displayName) {
  Store::Will will;
  will.sets = deathNotice(runId, r, node,
                          "node " + std::string(displayName) + " left round " + std::to_string(r) +
                              " after its workers succeeded");
  // status of round r+1: a finished member is pulled back when the job re-forms (another node
  // failed), and until it counts itself back there, this will is what tells that round's
  // waiters that it will not come (they waited for it until the join timeout).
  will.adds = {{left(runId, r), 1},
               {changes(runId, r), 1},
               {status(runId, r + 1), 1},
               {present(runId), -1}};
  return will;
}

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
                    "\t" + std::to_string(s.restartCount) + "\n";
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
  // MASTER_ADDR goes to every worker (torch connects to it and unpickles what it serves): a host
  // name or an address, nothing else. Counts are within what a round can hold.
  if (f.size() != 8 || !(nodes = parseInt<int>(f[1])) || *nodes < 1 || *nodes > kMaxNodes ||
      !(world = parseInt<int>(f[2])) || *world < *nodes ||
      int64_t{*world} > int64_t{*nodes} * kMaxLocalWorldSize || !isHostOrAddress(f[3]) ||
      !(port = parseInt<uint16_t>(f[4])) || !(changes = parseInt<int64_t>(f[5])) ||
      *changes < 0 || !(left = parseInt<int64_t>(f[6])) || *left < 0 ||
      !(restarts = parseInt<int>(f[7])) || *restarts < 0)
    throw corrupt();
  s.nodeCount = *nodes;
  s.worldSize = *world;
  s.masterAddr = std::string(f[3]);
  s.masterPort = *port;
  s.changesAtClose = *changes;
  s.leftAtClose = *left;
  s.restartCount = *restarts;
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
  if (!s.roster.empty() && (static_cast<int>(s.roster.size()) != s.nodeCount || sum != s.worldSize))
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

// The largest first number of a folded run parseHostList accepts; the encoder folds only names
// within it, so everything it writes parses back (a fuzz-found disagreement: a 17-digit number).
constexpr int64_t kMaxRunStart = int64_t{1} << 53;

// A name split around its last run of digits (at most 18: fits an int64).
struct Numbered {
  std::string_view prefix, digits, suffix;
  int64_t number = 0;
  int width = 0;  // zero-padded width, 0 = not padded
};

std::optional<Numbered> splitNumber(std::string_view name) {
  size_t end = name.find_last_of("0123456789");
  if (end == std::string_view::npos) return std::nullopt;
  size_t begin = end;
  while (begin > 0 && name[begin - 1] >= '0' && name[begin - 1] <= '9') --begin;
  Numbered n;
  n.prefix = name.substr(0, begin);
  n.digits = name.substr(begin, end + 1 - begin);
  n.suffix = name.substr(end + 1);
  if (n.digits.size() > 18) return std::nullopt;
  n.number = *parseInt<int64_t>(n.digits);
  if (n.number > kMaxRunStart) return std::nullopt;  // written as a plain "=" line instead
  n.width = n.digits.size() > 1 && n.digits[0] == '0' ? static_cast<int>(n.digits.size()) : 0;
  return n;
}

std::string formatNumber(int64_t number, int width) {
  std::string digits = std::to_string(number);
  if (static_cast<int>(digits.size()) < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

}  // namespace

std::string encodeHostList(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size();) {
    auto first = splitNumber(names[i]);
    size_t count = 1;
    if (first) {
      while (i + count < names.size()) {
        auto next = splitNumber(names[i + count]);
        if (!next || next->prefix != first->prefix || next->suffix != first->suffix ||
            next->digits != formatNumber(first->number + static_cast<int64_t>(count), first->width))
          break;
        ++count;
      }
    }
    if (count == 1) {
      out.append("=").append(names[i]).append("\n");
    } else {
      out.append("~").append(first->prefix).append("\t").append(std::to_string(first->number));
      out.append("\t").append(std::to_string(count)).append("\t");
      out.append(std::to_string(first->width)).append("\t").append(first->suffix).append("\n");
    }
    i += count;
  }
  return out;
}

std::vector<std::string> parseHostList(std::string_view value, size_t expected) {
  auto corrupt = [&](const std::string& why) {
    return ProtocolError("corrupt hosts list (" + why + "): '" +
                         text::printable(value.substr(0, 80)) + "'");
  };
  std::vector<std::string> names;
  names.reserve(expected);
  for (size_t start = 0; start < value.size();) {
    size_t end = value.find('\n', start);
    if (end == std::string_view::npos) throw corrupt("torn line");
    std::string_view line = value.substr(start, end - start);
    start = end + 1;
    if (line.starts_with("=") && isPlainField(line.substr(1), kMaxName)) {
      if (names.size() >= expected) throw corrupt("more than " + std::to_string(expected));
      names.emplace_back(line.substr(1));
      continue;
    }
    auto f = splitTabs(line.starts_with("~") ? line.substr(1) : std::string_view{});
    std::optional<int64_t> first, count;
    std::optional<int> width;
    if (f.size() != 5 || !(first = parseInt<int64_t>(f[1])) || *first < 0 ||
        !(count = parseInt<int64_t>(f[2])) || *count < 2 || !(width = parseInt<int>(f[3])) ||
        *width < 0 || *width > 18 || *first > kMaxRunStart ||
        !isPlainField(cat(f[0], cat(formatNumber(*first, *width), f[4])), kMaxName))
      throw corrupt("bad line");
    if (*count > static_cast<int64_t>(expected - names.size()))
      throw corrupt("more than " + std::to_string(expected));
    for (int64_t k = 0; k < *count; ++k) {
      std::string name(f[0]);
      name.append(formatNumber(*first + k, *width)).append(f[4]);
      names.push_back(std::move(name));
    }
  }
  if (names.size() != expected)
    throw corrupt(std::to_string(names.size()) + " names, expected " + std::to_string(expected));
  return names;
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

}  // namespace drun::rdzv::keys

namespace drun::rdzv::keys {

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

// The key scheme's names and wills, and the validation of run ids, node ids and hosts.
#include "drun/rendezvous/keys.hpp"

#include <arpa/inet.h>

#include "drun/common/error.hpp"
#include "key_text.hpp"

namespace drun::rdzv::keys {

using namespace detail;

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
std::string recoveries(std::string_view runId, uint64_t r) {
  return cat(round(runId, r), "recoveries");
}
std::string workerStore(std::string_view runId, uint64_t r) { return cat(round(runId, r), "workers/"); }
std::string vacancy(std::string_view runId, uint64_t r, std::string_view lostNode) {
  return cat(round(runId, r), cat("vacancy/", lostNode));
}
std::string vacancyClaim(std::string_view runId, uint64_t r, std::string_view lostNode) {
  return cat(vacancy(runId, r, lostNode), "/claim");
}
std::string vacancyTaker(std::string_view runId, uint64_t r, std::string_view lostNode) {
  return cat(vacancy(runId, r, lostNode), "/taker");
}
std::string vacancies(std::string_view runId, uint64_t r) { return cat(round(runId, r), "vacancies"); }
std::string replaced(std::string_view runId, uint64_t r) { return cat(round(runId, r), "replaced"); }
std::string dropped(std::string_view runId, uint64_t r) { return cat(round(runId, r), "dropped"); }
std::string grows(std::string_view runId, uint64_t r) { return cat(round(runId, r), "grows"); }
std::string grown(std::string_view runId, uint64_t r) { return cat(round(runId, r), "grown"); }
std::string growPlace(int64_t k) { return "grow-" + std::to_string(k); }
bool isGrowPlace(std::string_view placeId) { return placeId.starts_with("grow-"); }
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


}  // namespace drun::rdzv::keys

// The c10d-style rendezvous over a Store. Design and key scheme: keys.hpp, rendezvous/README.md.
//
// One round, seen from one joiner (7 store calls; the closer adds 4 whose size is O(N)):
//   setWill(dead flag, last_change, changes+1, status+1, left+1)
//   append(joined, my descriptor line); n = add(count, 1)
//   n >= MAX: try to close;  MIN <= n < MAX: arm the last call (compare_set lastcall "" -> me)
//   watch(status): returns the decision's header once the round closed, or an event (a will
//   fired, last call disarmed) after which the joiner looks again; a local timer runs the last
//   call. Then get(assign/<me>) and get(hosts) (a compact host list: runs like node[0-4095]).
// Closing: read changes (c0), joined, (only when c0 > 0) the dead flags; take the first MAX alive
// joiners; plan ranks; compare_set(state, "" -> decision with roster) decides among concurrent
// closers; the winner multi_sets every assignment, hosts, round = r + 1 and status = header.
#include "drun/rendezvous/c10d_rendezvous.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include <spdlog/spdlog.h>

#include "drun/common/deadline.hpp"
#include "drun/common/error.hpp"
#include "drun/rendezvous/port_reservation.hpp"
#include "drun/rendezvous/store_server.hpp"
#include "drun/rendezvous/tcp_store.hpp"

namespace drun::rdzv {
namespace {

using keys::NodeDescriptor;
using keys::RoundState;

// A membership watcher blocks in watch() at most this long before it looks at its stop flag;
// a stopped watcher's thread (detached) lingers at most this long.
constexpr milliseconds kWatchSlice = 2s;
// How many joined nodes a timeout message names.
constexpr size_t kMaxNamesInMessage = 32;

std::string newNodeId() {
  std::random_device rd;
  std::mt19937_64 gen((uint64_t(rd()) << 32) ^ rd() ^
                      uint64_t(Clock::now().time_since_epoch().count()));
  char buf[48];
  std::snprintf(buf, sizeof buf, "%x-%016llx", unsigned(::getpid()),
                static_cast<unsigned long long>(gen()));
  return buf;
}

// Host order for node ranks: digit runs compare as numbers (node2 < node10), so that ranks
// follow the numbering users see, and the hosts list folds into runs.
bool naturalLess(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  auto isDigit = [](char c) { return c >= '0' && c <= '9'; };
  while (i < a.size() && j < b.size()) {
    if (isDigit(a[i]) && isDigit(b[j])) {
      size_t ie = i, je = j;
      while (ie < a.size() && isDigit(a[ie])) ++ie;
      while (je < b.size() && isDigit(b[je])) ++je;
      // Compare the numbers without their leading zeros: longer is larger, else digit by digit.
      size_t is = i, js = j;
      while (is + 1 < ie && a[is] == '0') ++is;
      while (js + 1 < je && b[js] == '0') ++js;
      if (ie - is != je - js) return ie - is < je - js;
      if (int c = a.substr(is, ie - is).compare(b.substr(js, je - js)); c != 0) return c < 0;
      if (ie - i != je - j) return ie - i < je - j;  // fewer leading zeros first
      i = ie;
      j = je;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

std::string hostName() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host[0] ? host : "localhost";
}

std::string ms(milliseconds d) { return std::to_string(d.count()) + "ms"; }

// The delay of a backup closer (a joiner that did not arm the last call) behind the armer, so
// that normally exactly one node evaluates the close.
milliseconds backupMargin(milliseconds lastCall) {
  return std::max<milliseconds>(100ms, lastCall / 10);
}

// The callback set by onMembershipChange, shared with the watcher threads.
struct CallbackSlot {
  std::mutex mutex;
  std::function<void(const std::string&)> callback;
};

// Watches rdzv/<id>/<r>/changes of one closed round on its own connection and reports changes.
// Its thread is detached and ends within kWatchSlice of the watcher's destruction (it owns
// everything it touches), so stopping never waits on the network.
class MembershipWatcher {
 public:
  MembershipWatcher(std::unique_ptr<Store> store, std::string runId, uint64_t round,
                    int64_t baseline, std::string endpoint, std::shared_ptr<CallbackSlot> slot)
      : slot_(std::move(slot)), stopped_(std::make_shared<std::atomic<bool>>(false)) {
    std::thread([store = std::shared_ptr<Store>(std::move(store)), runId = std::move(runId), round,
                 baseline, endpoint = std::move(endpoint), slot = slot_,
                 stopped = stopped_]() mutable {
      run(*store, runId, round, baseline, endpoint, *slot, *stopped);
    }).detach();
  }
  // After the destructor returns, the callback is not running and will not be called by this
  // watcher.
  ~MembershipWatcher() {
    stopped_->store(true);
    std::lock_guard lock(slot_->mutex);  // waits out a callback in progress
  }

 private:
  static void fire(CallbackSlot& slot, const std::atomic<bool>& stopped,
                   const std::string& reason) {
    std::lock_guard lock(slot.mutex);
    if (stopped.load() || !slot.callback) return;
    try {
      slot.callback(reason);
    } catch (...) {
      // The callback is the owner's; nothing here could report its failure (see run()), and
      // an exception must not end this thread, nor be taken for a lost store.
    }
  }

  static void run(Store& store, const std::string& runId, uint64_t round, int64_t baseline,
                  const std::string& endpoint, CallbackSlot& slot, std::atomic<bool>& stopped) {
    const std::string changesKey = keys::changes(runId, round);
    std::optional<Bytes> known;
    if (baseline > 0) known = std::to_string(baseline);
    try {
      while (!stopped.load()) {
        std::optional<Bytes> now;
        try {
          now = store.watch(changesKey, known, kWatchSlice);
        } catch (const TimeoutError&) {
          continue;
        }
        if (stopped.load()) return;
        known = now;
        auto reason = store.tryGet(keys::lastChange(runId, round));
        fire(slot, stopped,
             reason.value_or("the membership of round " + std::to_string(round) + " changed"));
      }
    } catch (const std::exception& e) {
      // No logging here: this thread may outlive the process' loggers (it is detached); the
      // reason goes to the callback, whose owner reports it.
      fire(slot, stopped, "lost the rendezvous store at " + endpoint + ": " + e.what());
    }
  }

  std::shared_ptr<CallbackSlot> slot_;
  std::shared_ptr<std::atomic<bool>> stopped_;
};

class C10dRendezvous final : public Rendezvous {
 public:
  C10dRendezvous(const RendezvousOptions& options, C10dStoreAccess access)
      : options_(options),
        store_(std::move(access.store)),
        connectWatcher_(std::move(access.connectWatcher)),
        endpoint_(access.endpoint.empty() ? "the store" : access.endpoint),
        server_(std::move(access.server)),
        slot_(std::make_shared<CallbackSlot>()) {
    keys::validateRunId(options_.runId);
    if (!store_) throw InvalidArgument("c10d rendezvous: no store");
    if (options_.minNodes < 1 || options_.maxNodes < options_.minNodes)
      throw InvalidArgument("invalid --nnodes " + std::to_string(options_.minNodes) + ":" +
                            std::to_string(options_.maxNodes));
    self_.id = newNodeId();
    self_.host = options_.localAddr.empty() ? hostName() : options_.localAddr;
    self_.addr = !options_.localAddr.empty()    ? options_.localAddr
                 : !access.selfAddress.empty() ? access.selfAddress
                                               : "127.0.0.1";
    self_.localWorldSize = options_.localWorldSize;
    self_.requestedRank = options_.nodeRank;
    keys::encodeDescriptor(self_);  // validates the fields before anything touches the store
  }

  ~C10dRendezvous() override {
    stopWatcher();
    // Closing the connection without leave() runs the will: the others see this node die.
    store_.reset();
    if (server_) server_->stop();
  }

  RoundResult next() override {
    if (left_) throw InvalidArgument("rendezvous '" + options_.runId + "': next() after leave()");
    stopWatcher();
    const Deadline deadline(options_.joinTimeout);
    const auto started = Clock::now();
    if (reservation_.port() == 0) reservation_ = PortReservation::reserve(self_.addr);
    self_.masterPort = reservation_.port();
    descriptorLine_ = keys::encodeDescriptor(self_);

    uint64_t round = keys::parseCounter(store_->tryGet(keys::currentRound(options_.runId)))
                         .value_or(0);
    // What to tell the nodes of a running round once this node's will names its new round (so
    // that the old round never counts this node's death).
    Announcement announce;
    if (lastRound_) {
      round = std::max(round, *lastRound_ + 1);
      announce = {*lastRound_, "node " + self_.displayName() + " is re-joining (round " +
                                   std::to_string(round) + ")"};
    } else if (round > 0) {
      // The job runs round-1 (the latest closed one): tell its nodes that one more waits.
      announce = {round - 1, "node " + self_.displayName() + " is waiting to join (round " +
                                 std::to_string(round) + ")"};
    }
    for (;;) {
      if (auto result = joinRound(round, deadline, announce)) {
        lastRound_ = round;
        spdlog::debug("rendezvous '{}': round {} formed in {}: node rank {} of {}, world size {}",
                      options_.runId, round,
                      ms(std::chrono::duration_cast<milliseconds>(Clock::now() - started)),
                      result->nodeRank, result->nodeCount, result->worldSize);
        startWatcher(round, changesAtClose_);
        return *result;
      }
      // The round closed without this node: wait in the next one, and tell the running nodes.
      spdlog::debug("rendezvous '{}': round {} closed without this node; waiting for round {}",
                    options_.runId, round, round + 1);
      announce = {round, "node " + self_.displayName() + " is waiting to join (round " +
                             std::to_string(round + 1) + ")"};
      ++round;
    }
  }

  void leave() override {
    if (left_) return;
    left_ = true;
    stopWatcher();
    try {
      // A clean leave is not a death: drop the will first, so nobody is told to restart.
      store_->setWill({});
      if (lastRound_) {
        // The last member of the latest round to go removes the job's keys, unless nodes
        // already wait in the next round.
        const uint64_t round = *lastRound_;
        const int64_t gone = store_->add(keys::left(id(), round), 1) - leftAtClose_;
        if (gone >= lastNodeCount_ && !store_->check({keys::count(id(), round + 1)}))
          removeJobKeys();
        if (server_) waitForOthersToLeave(round);
      }
    } catch (const Error& e) {
      spdlog::warn("rendezvous '{}': leave: {}", options_.runId, e.what());
    }
    reservation_.release();
    store_.reset();
    if (server_) server_->stop();
  }

  void onMembershipChange(std::function<void(const std::string&)> callback) override {
    std::lock_guard lock(slot_->mutex);
    slot_->callback = std::move(callback);
  }

 private:
  const std::string& id() const { return options_.runId; }

  struct Announcement {
    std::optional<uint64_t> round;
    std::string reason;
  };

  // Joins round `round`; returns the result, or nullopt when the round closed without this node.
  std::optional<RoundResult> joinRound(uint64_t round, const Deadline& deadline,
                                       const Announcement& announce) {
    Store& s = *store_;
    const bool elastic = options_.minNodes < options_.maxNodes;
    const std::string statusKey = keys::status(id(), round);
    constexpr auto kNever = Clock::time_point::max();

    s.setWill(keys::joinWill(id(), round, self_.id, self_.displayName()));
    if (announce.round) signalChange(*announce.round, announce.reason);
    s.append(keys::joined(id(), round), descriptorLine_);
    const int64_t arrival = s.add(keys::count(id(), round), 1);
    spdlog::debug("rendezvous '{}': joined round {} as arrival {} (need {}..{})", id(), round,
                  arrival, options_.minNodes, options_.maxNodes);
    // When this node evaluates the last call: the armer at the last call timeout, the others a
    // margin later (they take over only if the armer died).
    Clock::time_point lastCallAt = kNever;
    auto startLastCall = [&](bool armedByMe) {
      lastCallAt = Clock::now() + options_.lastCallTimeout +
                   (armedByMe ? 0ms : backupMargin(options_.lastCallTimeout));
    };
    if (!(arrival >= options_.maxNodes && tryClose(round, options_.maxNodes)) && elastic &&
        arrival >= options_.minNodes)
      startLastCall(armLastCall(round));

    std::optional<Bytes> known;  // status as last seen (nullopt: absent)
    bool event = false;          // `known` came from a watch that returned: something happened
    for (;;) {
      if (known)
        if (auto state = keys::parseState(*known)) return finish(round, *state);
      if (event) {
        event = false;
        // The decision can exist before status shows it (its closer died in between).
        if (auto decided = s.tryGet(keys::state(id(), round)))
          if (auto state = keys::parseState(*decided)) return finish(round, *state);
        if (elastic) {
          auto armer = s.tryGet(keys::lastCall(id(), round));
          if (!armer)
            lastCallAt = kNever;
          else if (lastCallAt == kNever)
            startLastCall(*armer == self_.id);
        }
        // With MAX arrivals counted and still open, the closer may have died mid-close: one
        // waiter, elected per event, evaluates again.
        if (known) {
          auto arrivals = keys::parseCounter(s.tryGet(keys::count(id(), round))).value_or(0);
          if (arrivals >= options_.maxNodes &&
              s.compareSet(keys::reeval(id(), round, *known), "", self_.id) == self_.id)
            tryClose(round, options_.maxNodes);
        }
      }
      if (Clock::now() >= lastCallAt) {
        if (!tryClose(round, options_.minNodes)) disarmLastCall(round);
        lastCallAt = kNever;
      }
      if (deadline.expired()) timedOut(round);
      milliseconds wait = deadline.remaining();
      if (lastCallAt != kNever) {
        auto untilLastCall = std::chrono::duration_cast<milliseconds>(lastCallAt - Clock::now());
        wait = std::min(wait, std::max(untilLastCall + 1ms, 1ms));  // remaining() may be 0
      }
      // Returns at once when status differs from `known` (also after this node's own writes).
      try {
        known = s.watch(statusKey, known, wait);
        event = true;
      } catch (const TimeoutError&) {
      }
    }
  }

  // Evaluates the round and closes it when at least `needed` alive nodes joined. Returns false
  // when too few are alive (nothing written).
  bool tryClose(uint64_t round, int needed) {
    Store& s = *store_;
    const auto t0 = Clock::now();
    // Read the change counter before the snapshot: a death after this read makes the watch
    // baseline stale (a spurious, harmless notification), never a missed one.
    const int64_t changesAtRead =
        keys::parseCounter(s.tryGet(keys::changes(id(), round))).value_or(0);
    size_t skipped = 0;
    auto nodes = keys::parseJoined(s.tryGet(keys::joined(id(), round)).value_or(""), &skipped);
    if (skipped)
      spdlog::warn("rendezvous '{}': round {}: ignored {} malformed joiner record(s)", id(), round,
                   skipped);
    if (changesAtRead > 0) removeDead(round, nodes);
    if (static_cast<int>(nodes.size()) < needed) {
      spdlog::debug("rendezvous '{}': round {}: {} alive joiner(s), need {}: not closing", id(),
                    round, nodes.size(), needed);
      return false;
    }
    if (static_cast<int>(nodes.size()) > options_.maxNodes) nodes.resize(options_.maxNodes);

    // Read after the snapshot: a will that fires in between belongs to a member (counted as one
    // that left: the host then waits out closeTimeout at worst), never the other way round.
    const int64_t leftAtRead = keys::parseCounter(s.tryGet(keys::left(id(), round))).value_or(0);
    RoundDecision d = decideRound(id(), round, nodes, {changesAtRead, leftAtRead});
    if (s.compareSet(keys::state(id(), round), "", d.decision) == d.decision) {
      s.multiSet(d.keys, d.values);
      spdlog::debug("rendezvous '{}': closed round {} with {} node(s) in {}{}", id(), round,
                    nodes.size(),
                    ms(std::chrono::duration_cast<milliseconds>(Clock::now() - t0)),
                    d.state.ok ? "" : ": " + d.state.error);
    }
    return true;
  }

  void removeDead(uint64_t round, std::vector<NodeDescriptor>& nodes) {
    std::erase_if(nodes, [&](const NodeDescriptor& n) {
      return store_->tryGet(keys::dead(id(), round, n.id)).has_value();
    });
  }

  // Returns whether this node armed it (the others are backups).
  bool armLastCall(uint64_t round) {
    if (store_->compareSet(keys::lastCall(id(), round), "", self_.id) != self_.id) return false;
    spdlog::debug("rendezvous '{}': round {}: {} nodes reached, last call in {}", id(), round,
                  options_.minNodes, ms(options_.lastCallTimeout));
    return true;
  }

  // Too few alive at the last call: start over, so the next arrival arms it afresh. Waiters are
  // told (status+1) so that they drop their timers.
  void disarmLastCall(uint64_t round) {
    store_->deleteKey(keys::lastCall(id(), round));
    bumpStatus(round);
  }

  void bumpStatus(uint64_t round) {
    try {
      store_->add(keys::status(id(), round), 1);
    } catch (const InvalidArgument&) {
      // The round closed meanwhile: status holds the state now.
    }
  }

  void signalChange(uint64_t round, const std::string& reason) {
    store_->set(keys::lastChange(id(), round), reason);
    store_->add(keys::changes(id(), round), 1);
  }

  // The round is decided (`state` may be the header only). Returns nullopt when this node is not
  // in it.
  std::optional<RoundResult> finish(uint64_t round, const RoundState& state) {
    if (!state.ok)
      throw InvalidArgument("rendezvous '" + id() + "' round " + std::to_string(round) +
                            " failed: " + state.error);
    RoundResult r;
    r.round = round;
    r.nodeCount = state.nodeCount;
    r.worldSize = state.worldSize;
    r.masterAddr = state.masterAddr;
    r.masterPort = state.masterPort;
    r.storePrefix = keys::round(id(), round);
    if (auto mine = store_->tryGet(keys::assign(id(), round, self_.id))) {
      const keys::Assignment a = keys::parseAssignment(*mine);
      r.nodeRank = a.nodeRank;
      r.rankOffset = a.rankOffset;
      r.hosts = keys::parseHostList(store_->get(keys::hosts(id(), round), options_.readTimeout),
                                    static_cast<size_t>(r.nodeCount));
    } else {
      // Not a member, or its closer died before publishing the assignments: the roster in
      // `state` decides (O(N) bytes, read on this rare path only).
      auto decided = keys::parseState(store_->get(keys::state(id(), round), options_.readTimeout));
      if (!decided || decided->roster.empty())
        throw ProtocolError("rendezvous '" + id() + "' round " + std::to_string(round) +
                            ": the decision has no roster");
      bool member = false;
      int offset = 0;
      for (size_t rank = 0; rank < decided->roster.size(); ++rank) {
        const auto& entry = decided->roster[rank];
        if (entry.id == self_.id) {
          member = true;
          r.nodeRank = static_cast<int>(rank);
          r.rankOffset = offset;
        }
        offset += entry.localWorldSize;
        r.hosts.push_back(entry.name);
      }
      if (!member) return std::nullopt;
    }
    if (static_cast<int>(r.hosts.size()) != r.nodeCount || r.nodeRank >= r.nodeCount ||
        int64_t{r.rankOffset} + options_.localWorldSize > r.worldSize)
      throw ProtocolError("rendezvous '" + id() + "' round " + std::to_string(round) +
                          ": inconsistent decision in the store (node rank " +
                          std::to_string(r.nodeRank) + " of " + std::to_string(r.nodeCount) +
                          ", " + std::to_string(r.hosts.size()) + " hosts)");
    changesAtClose_ = state.changesAtClose;
    leftAtClose_ = state.leftAtClose;
    lastNodeCount_ = state.nodeCount;
    return r;
  }

  // The join timeout passed: give up this node's place (as its will would) and say who came.
  [[noreturn]] void timedOut(uint64_t round) {
    std::string who;
    size_t alive = 0;
    try {
      auto nodes = keys::parseJoined(store_->tryGet(keys::joined(id(), round)).value_or(""));
      std::erase_if(nodes, [&](const NodeDescriptor& n) { return n.id == self_.id; });
      removeDead(round, nodes);
      alive = nodes.size() + 1;
      who = self_.displayName() + " (this node)";
      for (size_t i = 0; i < nodes.size() && i + 1 < kMaxNamesInMessage; ++i)
        who += ", " + nodes[i].displayName();
      if (nodes.size() + 1 > kMaxNamesInMessage)
        who += ", and " + std::to_string(nodes.size() + 1 - kMaxNamesInMessage) + " more";
      // Do what the will would do (minus `left`: this node was never a member), then drop the
      // will so that this agent's exit does not count twice.
      store_->set(keys::dead(id(), round, self_.id), "1");
      signalChange(round, "node " + self_.displayName() + " gave up waiting in round " +
                              std::to_string(round));
      bumpStatus(round);
      store_->setWill({});
    } catch (const Error& e) {
      who = "unknown (" + std::string(e.what()) + ")";
    }
    std::string need = options_.minNodes == options_.maxNodes
                           ? std::to_string(options_.minNodes)
                           : "at least " + std::to_string(options_.minNodes) + " (max " +
                                 std::to_string(options_.maxNodes) + ")";
    throw TimeoutError("rendezvous '" + id() + "' round " + std::to_string(round) + " at " +
                       endpoint_ + " timed out after " + ms(options_.joinTimeout) + ": " +
                       std::to_string(alive) + " node(s) joined [" + who + "], need " + need);
  }

  void startWatcher(uint64_t round, int64_t baseline) {
    if (!connectWatcher_) return;
    watcher_ = std::make_unique<MembershipWatcher>(connectWatcher_(), id(), round, baseline,
                                                   endpoint_, slot_);
  }

  void stopWatcher() { watcher_.reset(); }

  void removeJobKeys() {
    try {
      int64_t n = store_->deletePrefix(keys::job(id()));
      spdlog::debug("rendezvous '{}': last agent out, removed {} key(s)", id(), n);
    } catch (const InvalidArgument& e) {
      spdlog::debug("rendezvous '{}': keys left in the store: {}", id(), e.what());
    }
  }

  // The hosting agent keeps the store up until the other members left (or closeTimeout).
  void waitForOthersToLeave(uint64_t round) {
    const Deadline deadline(options_.closeTimeout);
    const std::string key = keys::left(id(), round);
    for (;;) {
      auto value = store_->tryGet(key);
      const int64_t remaining =
          lastNodeCount_ - (keys::parseCounter(value).value_or(0) - leftAtClose_);
      if (!value || remaining <= 0) return;  // absent: the last one removed the job's keys
      if (deadline.expired()) {
        spdlog::info("rendezvous '{}': stopping the store with {} node(s) still attached after {}",
                     id(), remaining, ms(options_.closeTimeout));
        return;
      }
      try {
        store_->watch(key, value, deadline.remaining());
      } catch (const TimeoutError&) {
      }
    }
  }

  RendezvousOptions options_;
  std::unique_ptr<Store> store_;
  std::function<std::unique_ptr<Store>()> connectWatcher_;
  std::string endpoint_;
  std::unique_ptr<StoreServer> server_;
  std::shared_ptr<CallbackSlot> slot_;
  std::unique_ptr<MembershipWatcher> watcher_;
  NodeDescriptor self_;
  std::string descriptorLine_;
  PortReservation reservation_;
  std::optional<uint64_t> lastRound_;
  int64_t changesAtClose_ = 0;
  int64_t leftAtClose_ = 0;
  int64_t lastNodeCount_ = 0;
  bool left_ = false;
};

bool isLoopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    auto a = ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr);
    return (a >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* a6 = &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a6) ||
           (IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127);
  }
  return false;
}

bool sameAddress(const sockaddr* a, const sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  if (a->sa_family == AF_INET6)
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, 16) == 0;
  return false;
}

}  // namespace

RoundPlan planRound(const std::vector<NodeDescriptor>& members) {
  const int n = static_cast<int>(members.size());
  if (n == 0) throw InvalidArgument("a round needs at least one node");
  RoundPlan plan;
  plan.nodeRank.assign(n, -1);
  plan.memberAtRank.assign(n, -1);
  for (int i = 0; i < n; ++i) {
    if (!members[i].requestedRank) continue;
    const int r = *members[i].requestedRank;
    if (r >= n)
      throw InvalidArgument("node rank " + std::to_string(r) + " requested by " +
                            members[i].displayName() + " is out of range: the round has " +
                            std::to_string(n) + " node(s), ranks 0.." + std::to_string(n - 1));
    if (plan.memberAtRank[r] >= 0)
      throw InvalidArgument("node rank " + std::to_string(r) + " claimed by " +
                            members[plan.memberAtRank[r]].displayName() + " and " +
                            members[i].displayName());
    plan.memberAtRank[r] = i;
    plan.nodeRank[i] = r;
  }
  std::vector<int> unranked;
  for (int i = 0; i < n; ++i)
    if (plan.nodeRank[i] < 0) unranked.push_back(i);
  std::sort(unranked.begin(), unranked.end(), [&](int a, int b) {
    if (members[a].host != members[b].host) return naturalLess(members[a].host, members[b].host);
    return members[a].arrival < members[b].arrival;
  });
  int next = 0;
  for (int i : unranked) {
    while (plan.memberAtRank[next] >= 0) ++next;
    plan.memberAtRank[next] = i;
    plan.nodeRank[i] = next;
  }
  plan.rankOffset.assign(n, 0);
  int64_t sum = 0;
  for (int r = 0; r < n; ++r) {
    const int i = plan.memberAtRank[r];
    plan.rankOffset[i] = static_cast<int>(sum);
    sum += members[i].localWorldSize;
    if (sum > INT_MAX) throw InvalidArgument("world size over " + std::to_string(INT_MAX));
  }
  plan.worldSize = static_cast<int>(sum);
  const auto& master = members[plan.memberAtRank[0]];
  plan.masterAddr = master.addr;
  plan.masterPort = master.masterPort;
  return plan;
}

RoundDecision decideRound(const std::string& runId, uint64_t round,
                          const std::vector<NodeDescriptor>& members, RoundCounters counters) {
  RoundDecision d;
  d.state.changesAtClose = counters.changes;
  d.state.leftAtClose = counters.left;
  try {
    RoundPlan plan = planRound(members);
    d.state.nodeCount = static_cast<int>(members.size());
    d.state.worldSize = plan.worldSize;
    d.state.masterAddr = plan.masterAddr;
    d.state.masterPort = plan.masterPort;
    d.state.roster.reserve(members.size());
    std::vector<std::string> hosts;
    hosts.reserve(members.size());
    for (int i : plan.memberAtRank) {
      d.state.roster.push_back(
          {members[i].id, members[i].displayName(), members[i].localWorldSize});
      hosts.push_back(d.state.roster.back().name);
    }
    d.keys.reserve(members.size() + 3);
    d.values.reserve(members.size() + 3);
    for (size_t i = 0; i < members.size(); ++i) {
      d.keys.push_back(keys::assign(runId, round, members[i].id));
      d.values.push_back(keys::encodeAssignment({plan.nodeRank[i], plan.rankOffset[i]}));
    }
    d.keys.push_back(keys::hosts(runId, round));
    d.values.push_back(keys::encodeHostList(hosts));
  } catch (const InvalidArgument& e) {
    d.state = {};
    d.state.ok = false;
    d.state.error = e.what();
  }
  d.decision = keys::encodeState(d.state);
  d.keys.push_back(keys::currentRound(runId));
  d.values.push_back(std::to_string(round + 1));
  d.keys.push_back(keys::status(runId, round));  // last: waiters read the rest after it
  d.values.push_back(keys::encodeState(d.state, /*withRoster=*/false));
  return d;
}

bool isLocalEndpoint(const std::string& host, const std::string& localAddr) {
  if (host.empty()) return false;
  if (!localAddr.empty() && host == localAddr) return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* resolved = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &resolved) != 0) return false;
  ifaddrs* interfaces = nullptr;
  ::getifaddrs(&interfaces);
  bool local = false;
  for (addrinfo* ai = resolved; ai && !local; ai = ai->ai_next) {
    if (isLoopback(ai->ai_addr)) local = true;
    for (ifaddrs* i = interfaces; i && !local; i = i->ifa_next)
      if (i->ifa_addr && sameAddress(ai->ai_addr, i->ifa_addr)) local = true;
  }
  if (interfaces) ::freeifaddrs(interfaces);
  ::freeaddrinfo(resolved);
  return local;
}

std::string routeSourceAddress(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* resolved = nullptr;
  const std::string service = std::to_string(port == 0 ? 9 : port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &resolved); rc != 0)
    throw NetworkError("cannot resolve '" + host + "': " + ::gai_strerror(rc));
  std::string error = "no address";
  for (addrinfo* ai = resolved; ai; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      ::close(fd);
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw = local.ss_family == AF_INET
                            ? static_cast<const void*>(
                                  &reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                            : static_cast<const void*>(
                                  &reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      ::inet_ntop(local.ss_family, raw, text, sizeof text);
      ::freeaddrinfo(resolved);
      return text;
    }
    error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(resolved);
  throw NetworkError("no route to '" + host + "': " + error);
}

std::unique_ptr<Rendezvous> makeC10dRendezvous(const RendezvousOptions& options,
                                               C10dStoreAccess access) {
  return std::make_unique<C10dRendezvous>(options, std::move(access));
}

std::unique_ptr<Rendezvous> makeC10dRendezvous(const RendezvousOptions& options) {
  keys::validateRunId(options.runId);
  if (options.endpointHost.empty())
    throw InvalidArgument("the c10d rendezvous needs --rdzv-endpoint host[:port]");
  const bool wantHost = options.isHost.value_or(
      isLocalEndpoint(options.endpointHost, options.localAddr));

  C10dStoreAccess access;
  TcpStoreOptions client;
  client.host = options.endpointHost;
  client.port = options.endpointPort;
  if (wantHost) {
    try {
      StoreServerOptions serverOptions;
      serverOptions.port = options.endpointPort;
      serverOptions.maxLeaseTimeout = std::max<milliseconds>(serverOptions.maxLeaseTimeout,
                                                             options.heartbeatTimeout);
      access.server = std::make_unique<StoreServer>(serverOptions);
      access.server->start();
      client.host = "127.0.0.1";
      client.port = access.server->port();
      spdlog::info("rendezvous '{}': hosting the store on port {}", options.runId, client.port);
    } catch (const NetworkError& e) {
      // Another agent on this host, or a drun-rendezvous daemon, serves the endpoint already.
      // Anything else (a privileged port, no such address) would only end in a join timeout.
      if (std::string_view(e.what()).find(std::strerror(EADDRINUSE)) == std::string_view::npos)
        throw NetworkError("rendezvous '" + options.runId + "': cannot host the store on port " +
                           std::to_string(options.endpointPort) + ": " + e.what());
      access.server.reset();
      spdlog::info("rendezvous '{}': not hosting the store ({}); joining {}:{} as a client",
                   options.runId, e.what(), options.endpointHost, options.endpointPort);
    }
  }
  if (client.port == 0)
    throw InvalidArgument("--rdzv-endpoint " + options.endpointHost +
                          ":0 only works on the host that serves the store");
  client.connectTimeout = options.joinTimeout;
  client.timeout = options.readTimeout;
  client.heartbeatInterval = options.heartbeatInterval;
  client.leaseTimeout = options.heartbeatTimeout;

  access.endpoint = options.endpointHost + ":" + std::to_string(client.port);
  access.selfAddress = !options.localAddr.empty() ? options.localAddr
                       : access.server          ? options.endpointHost
                                                : routeSourceAddress(options.endpointHost,
                                                                     client.port);
  access.store = std::make_unique<TcpStore>(client);
  TcpStoreOptions watcher = client;
  watcher.connectTimeout = std::min(options.readTimeout, options.joinTimeout);
  access.connectWatcher = [watcher] { return std::make_unique<TcpStore>(watcher); };
  return makeC10dRendezvous(options, std::move(access));
}

}  // namespace drun::rdzv

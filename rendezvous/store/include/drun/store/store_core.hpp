// StoreCore: the key-value state behind every Store implementation, and its waiters.
//
// It knows nothing of bytes on a wire or of threads: MemoryStore drives it under a mutex,
// StoreServer from its single io thread. Blocking is expressed as waiters: a caller registers a
// callback that the core invokes, once, from inside the write that satisfies it (set, add,
// compareSet, append, multiSet, erase, erasePrefix, or a will). The caller owns deadlines and
// cancels a waiter that timed out. Each waiter belongs to a client (a connection, a MemoryStore
// handle); clientGone() drops that client's waiters and applies its will.
//
// Memory: what it holds is bounded. Stored keys and values count against StoreBudget (in all and
// per job scope "rdzv/<id>/"); a write over it is refused with InvalidArgument naming the limit.
// A watcher keeps the size and SHA-256 of the value it knows (KnownValue), never the value.
// Waiters' key lists and wills are bounded by the owner (StoreServer counts them per connection).
//
// Threading: not thread-safe; the owner serialises every call. Callbacks run synchronously with
// the state already updated; they may read the core (find/missing) but must not write to it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "drun/common/crypto.hpp"
#include "drun/store/store.hpp"

namespace drun::rdzv {

// Size limits of what the store accepts; the wire protocol enforces the same ones
// (protocol.hpp), so an in-process store and a remote one reject the same inputs.
struct StoreLimits {
  size_t maxKeyBytes = 4096;
  size_t maxValueBytes = 16u << 20;
  size_t maxKeysPerRequest = 65536;
};
inline constexpr StoreLimits kStoreLimits{};

// Throw InvalidArgument naming the offending key when an input is over the limits. Shared by the
// core and the wire encoder, so both refuse the same inputs with the same words.
void checkKeyLimit(const std::string& key, const StoreLimits& limits);
void checkValueLimit(const std::string& key, const Bytes& value, const StoreLimits& limits);
void checkKeyCountLimit(size_t count, const StoreLimits& limits);
// A key (or value) as the store's error messages show it: its first 64 bytes, then "...".
std::string shownKey(const std::string& key);

// How many bytes the store may hold (keys + values + kStoredEntryOverhead per key). A key
// "<jobRoot><id>/..." belongs to the job scope "<jobRoot><id>/"; every other key to the scope "".
// The option names are StoreServerOptions' (docs/protocol.md, "Limits").
struct StoreBudget {
  size_t maxStoredBytes = size_t{1} << 30;         // in all
  size_t maxStoredBytesPerJob = size_t{256} << 20;  // per job scope
  std::string jobRoot = "rdzv/";
};
// What one stored key costs beyond its bytes: the ordered map's node and two string headers.
inline constexpr size_t kStoredEntryOverhead = 96;

// What a watcher knows of a value: its size and SHA-256 (the bytes are not kept).
struct KnownValue {
  size_t size = 0;
  crypto::Digest digest{};
  static std::optional<KnownValue> of(const std::optional<Bytes>& value);
  bool matches(const Bytes& value) const;
};

class StoreCore {
 public:
  using ClientId = uint64_t;
  using WaiterId = uint64_t;  // 0 = "no waiter: ready at once"
  using Will = Store::Will;

  explicit StoreCore(StoreLimits limits = kStoreLimits, StoreBudget budget = {})
      : limits_(limits), budget_(std::move(budget)) {}

  const StoreLimits& limits() const { return limits_; }
  void validateKey(const std::string& key) const { checkKeyLimit(key, limits_); }
  void validateValue(const std::string& key, const Bytes& value) const {
    checkValueLimit(key, value, limits_);
  }
  void validateKeyCount(size_t count) const { checkKeyCountLimit(count, limits_); }

  // --- reads
  const Bytes* find(const std::string& key) const;
  std::optional<Bytes> tryGet(const std::string& key) const;
  bool check(const std::vector<std::string>& keys) const;
  std::vector<std::string> missing(const std::vector<std::string>& keys) const;
  int64_t numKeys() const { return static_cast<int64_t>(data_.size()); }
  // Bytes charged against the budget: in all, and of the scope `key` belongs to.
  size_t storedBytes() const { return storedBytes_; }
  size_t storedBytesOfScope(const std::string& key) const;
  const StoreBudget& budget() const { return budget_; }
  // The job scopes that hold keys, as their ids ("<jobRoot><id>/" -> "<id>"), sorted.
  std::vector<std::string> jobIds() const;
  // Monitoring (drun-rendezvous --http, --state-dir): adds an observer, called after every
  // change of a key, with its value now (nullptr: deleted), before the waiters it wakes run.
  // Observers run in the order added. Must not write to the core.
  using WriteObserver = std::function<void(const std::string& key, const Bytes* value)>;
  void observeWrites(WriteObserver observer) { observers_.push_back(std::move(observer)); }

  // --- writes; each wakes the waiters and watchers it satisfies before returning
  void set(const std::string& key, Bytes value);
  // Throws InvalidArgument when the stored value is not a decimal int64 or the sum overflows.
  int64_t add(const std::string& key, int64_t delta);
  Bytes compareSet(const std::string& key, const Bytes& expected, Bytes desired);
  bool erase(const std::string& key);
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values);
  void append(const std::string& key, const Bytes& value);
  int64_t erasePrefix(const std::string& prefix);

  // --- waiters
  ClientId newClient() { return ++lastClient_; }
  // Calls `ready` once every key exists. Returns 0 (and does not call) when they already do.
  WaiterId waitFor(ClientId client, std::vector<std::string> keys, std::function<void()> ready);
  // Calls `changed` with the new value (nullopt = absent) once the key's value differs from
  // `known`. Returns 0 (and does not call) when it already differs.
  WaiterId watch(ClientId client, std::string key, const std::optional<Bytes>& known,
                 std::function<void(const std::optional<Bytes>&)> changed);
  WaiterId watch(ClientId client, std::string key, std::optional<KnownValue> known,
                 std::function<void(const std::optional<Bytes>&)> changed);
  // Whether the key's value (nullopt = absent) differs from `known`.
  bool differs(const std::string& key, const std::optional<KnownValue>& known) const;
  // Forgets a waiter without calling it (deadline passed). Unknown ids are ignored.
  void cancel(WaiterId id);
  size_t waiterCount() const { return waiters_.size(); }

  // --- liveness
  void setWill(ClientId client, Will will);
  void clearWill(ClientId client);
  // The client is gone: drops its waiters without calling them, then applies its will (waking
  // others). Returns whether a will ran. Will entries the store rejects (an add on a
  // non-integer) are skipped.
  bool clientGone(ClientId client);
  // The job prefixes "<root><job>/" that hold keys but that no registered will names (every
  // agent of the job is gone): what a long-lived server may remove after a grace.
  std::vector<std::string> prefixesWithoutWill(const std::string& root) const;

 private:
  struct Waiter {
    ClientId client = 0;
    std::vector<std::string> keys;  // waitFor: all keys; watch: the one key
    size_t pendingKeys = 0;         // waitFor: keys registered as missing
    bool isWatch = false;
    std::optional<KnownValue> known;
    std::function<void()> ready;
    std::function<void(const std::optional<Bytes>&)> changed;
  };
  using Wakeups = std::vector<std::function<void()>>;

  void touched(const std::string& key, bool created, Wakeups& wakeups);
  void registerMissing(WaiterId id, Waiter& w);
  void removeWaiter(WaiterId id);
  static void run(Wakeups& wakeups);
  void setLocked(const std::string& key, Bytes value, Wakeups& wakeups);
  bool eraseLocked(const std::string& key, Wakeups& wakeups);
  int64_t addLocked(const std::string& key, int64_t delta, Wakeups& wakeups);
  std::string_view scopeOf(std::string_view key) const;
  // Throws InvalidArgument naming the limit when `growth` more bytes in `key`'s scope (and in
  // all) would pass the budget.
  void checkGrowth(const std::string& key, size_t growth) const;
  size_t growthOf(const std::string& key, size_t newValueBytes) const;
  void charge(const std::string& key, size_t oldCost, size_t newCost);

  StoreLimits limits_;
  StoreBudget budget_;
  std::vector<WriteObserver> observers_;
  size_t storedBytes_ = 0;
  std::unordered_map<std::string, size_t> scopeBytes_;  // bytes by scopeOf(key)
  std::map<std::string, Bytes, std::less<>> data_;  // ordered: erasePrefix is a range
  std::unordered_map<WaiterId, Waiter> waiters_;
  std::unordered_map<std::string, std::unordered_set<WaiterId>> keyWaiters_;   // missing keys
  std::unordered_map<std::string, std::unordered_set<WaiterId>> keyWatchers_;
  std::unordered_map<ClientId, std::unordered_set<WaiterId>> clientWaiters_;
  std::unordered_map<ClientId, Will> wills_;
  WaiterId lastWaiter_ = 0;
  ClientId lastClient_ = 0;
};

}  // namespace drun::rdzv

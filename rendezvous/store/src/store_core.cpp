#include "drun/store/store_core.hpp"

#include <algorithm>

#include <charconv>
#include <limits>

#include "drun/common/error.hpp"

namespace drun::rdzv {
namespace {

int64_t parseStoredInt(const std::string& key, const Bytes& value) {
  int64_t parsed = 0;
  const char* first = value.data();
  const char* last = value.data() + value.size();
  if (first != last && *first == '+') ++first;
  auto [ptr, ec] = std::from_chars(first, last, parsed);
  if (first == last || ec != std::errc() || ptr != last)
    throw InvalidArgument("add on key '" + shownKey(key) + "': stored value '" + shownKey(value) +
                          "' is not a decimal integer");
  return parsed;
}

size_t entryCost(const std::string& key, size_t valueBytes) {
  return key.size() + valueBytes + kStoredEntryOverhead;
}

std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

std::optional<KnownValue> KnownValue::of(const std::optional<Bytes>& value) {
  if (!value) return std::nullopt;
  return KnownValue{value->size(), crypto::sha256(*value)};
}

bool KnownValue::matches(const Bytes& value) const {
  return value.size() == size && crypto::equalDigests(crypto::sha256(value), digest);
}

// ---- the budget

std::string_view StoreCore::scopeOf(std::string_view key) const {
  const std::string& root = budget_.jobRoot;
  if (root.empty() || key.size() <= root.size() || key.compare(0, root.size(), root) != 0)
    return {};
  size_t slash = key.find('/', root.size());
  return slash == std::string_view::npos ? std::string_view{} : key.substr(0, slash + 1);
}

size_t StoreCore::storedBytesOfScope(const std::string& key) const {
  auto it = scopeBytes_.find(std::string(scopeOf(key)));
  return it == scopeBytes_.end() ? 0 : it->second;
}

size_t StoreCore::growthOf(const std::string& key, size_t newValueBytes) const {
  const Bytes* current = find(key);
  size_t before = current ? entryCost(key, current->size()) : 0;
  size_t after = entryCost(key, newValueBytes);
  return after > before ? after - before : 0;
}

void StoreCore::checkGrowth(const std::string& key, size_t growth) const {
  if (growth == 0) return;
  if (storedBytes_ + growth > budget_.maxStoredBytes)
    throw InvalidArgument("the store holds " + std::to_string(storedBytes_) + " bytes; writing key '" +
                          shownKey(key) + "' would pass its limit maxStoredBytes of " +
                          mib(budget_.maxStoredBytes) + " (drun-rendezvous --max-stored-bytes)");
  std::string_view scope = scopeOf(key);
  size_t inScope = storedBytesOfScope(key);
  if (inScope + growth > budget_.maxStoredBytesPerJob)
    throw InvalidArgument(
        (scope.empty() ? std::string("the keys outside any job") : "job scope " + std::string(scope)) +
        " holds " + std::to_string(inScope) + " bytes; writing key '" + shownKey(key) +
        "' would pass the limit maxStoredBytesPerJob of " + mib(budget_.maxStoredBytesPerJob) +
        " (drun-rendezvous --max-stored-bytes-per-job)");
}

void StoreCore::charge(const std::string& key, size_t oldCost, size_t newCost) {
  storedBytes_ = storedBytes_ - oldCost + newCost;
  std::string scope(scopeOf(key));
  size_t& bytes = scopeBytes_[scope];
  bytes = bytes - oldCost + newCost;
  if (bytes == 0) scopeBytes_.erase(scope);
}

// ---- reads and writes

const Bytes* StoreCore::find(const std::string& key) const {
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second;
}

std::optional<Bytes> StoreCore::tryGet(const std::string& key) const {
  const Bytes* v = find(key);
  return v ? std::optional<Bytes>(*v) : std::nullopt;
}

bool StoreCore::check(const std::vector<std::string>& keys) const {
  for (const auto& k : keys)
    if (!data_.count(k)) return false;
  return true;
}

std::vector<std::string> StoreCore::missing(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const auto& k : keys)
    if (!data_.count(k)) out.push_back(k);
  return out;
}

void StoreCore::run(Wakeups& wakeups) {
  for (auto& w : wakeups) w();
}

void StoreCore::set(const std::string& key, Bytes value) {
  validateKey(key);
  validateValue(key, value);
  checkGrowth(key, growthOf(key, value.size()));
  Wakeups wakeups;
  setLocked(key, std::move(value), wakeups);
  run(wakeups);
}

void StoreCore::setLocked(const std::string& key, Bytes value, Wakeups& wakeups) {
  auto [it, created] = data_.try_emplace(key);
  charge(key, created ? 0 : entryCost(key, it->second.size()), entryCost(key, value.size()));
  it->second = std::move(value);
  touched(key, created, wakeups);
}

int64_t StoreCore::add(const std::string& key, int64_t delta) {
  validateKey(key);
  Wakeups wakeups;
  int64_t result = addLocked(key, delta, wakeups);
  run(wakeups);
  return result;
}

int64_t StoreCore::addLocked(const std::string& key, int64_t delta, Wakeups& wakeups) {
  const Bytes* current = find(key);
  int64_t value = current ? parseStoredInt(key, *current) : 0;
  int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum))
    throw InvalidArgument("add on key '" + shownKey(key) + "': " + std::to_string(value) + " + " +
                          std::to_string(delta) + " overflows int64");
  std::string text = std::to_string(sum);
  checkGrowth(key, growthOf(key, text.size()));
  setLocked(key, std::move(text), wakeups);
  return sum;
}

Bytes StoreCore::compareSet(const std::string& key, const Bytes& expected, Bytes desired) {
  validateKey(key);
  validateValue(key, desired);
  const Bytes* current = find(key);
  if (!current) {
    // torch semantics: a missing key only counts as "expected" when expected is empty; otherwise
    // the caller is told its expectation (and learns nothing was stored).
    if (!expected.empty()) return expected;
  } else if (*current != expected) {
    return *current;
  }
  checkGrowth(key, growthOf(key, desired.size()));
  Wakeups wakeups;
  setLocked(key, desired, wakeups);
  run(wakeups);
  return desired;
}

bool StoreCore::erase(const std::string& key) {
  Wakeups wakeups;
  bool existed = eraseLocked(key, wakeups);
  run(wakeups);
  return existed;
}

bool StoreCore::eraseLocked(const std::string& key, Wakeups& wakeups) {
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  charge(key, entryCost(key, it->second.size()), 0);
  data_.erase(it);
  touched(key, false, wakeups);
  return true;
}

void StoreCore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size())
    throw InvalidArgument("multiSet: " + std::to_string(keys.size()) + " keys but " +
                          std::to_string(values.size()) + " values");
  validateKeyCount(keys.size());
  std::unordered_map<std::string_view, size_t> growthByScope;  // only growth: an upper bound
  size_t growth = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    validateKey(keys[i]);
    validateValue(keys[i], values[i]);
    size_t g = growthOf(keys[i], values[i].size());
    growth += g;
    size_t& inScope = growthByScope[scopeOf(keys[i])];
    inScope += g;
    checkGrowth(keys[i], inScope);  // this scope's growth so far
  }
  if (storedBytes_ + growth > budget_.maxStoredBytes) checkGrowth(keys.front(), growth);
  Wakeups wakeups;
  for (size_t i = 0; i < keys.size(); ++i) setLocked(keys[i], values[i], wakeups);
  run(wakeups);
}

void StoreCore::append(const std::string& key, const Bytes& value) {
  validateKey(key);
  const Bytes* current = find(key);
  size_t size = (current ? current->size() : 0) + value.size();
  if (size > limits_.maxValueBytes)
    throw InvalidArgument("append to key '" + shownKey(key) + "' would make it " +
                          std::to_string(size) + " bytes, over the limit of " +
                          std::to_string(limits_.maxValueBytes));
  checkGrowth(key, current ? value.size() : entryCost(key, value.size()));
  Wakeups wakeups;
  auto [it, created] = data_.try_emplace(key);
  charge(key, created ? 0 : entryCost(key, it->second.size()), entryCost(key, size));
  it->second += value;
  touched(key, created, wakeups);
  run(wakeups);
}

int64_t StoreCore::erasePrefix(const std::string& prefix) {
  if (prefix.empty()) throw InvalidArgument("deletePrefix: the prefix must not be empty");
  validateKey(prefix);
  Wakeups wakeups;
  int64_t removed = 0;
  auto it = data_.lower_bound(prefix);
  while (it != data_.end() && it->first.compare(0, prefix.size(), prefix) == 0) {
    std::string key = it->first;
    charge(key, entryCost(key, it->second.size()), 0);
    it = data_.erase(it);
    ++removed;
    touched(key, false, wakeups);
  }
  run(wakeups);
  return removed;
}

std::vector<std::string> StoreCore::jobIds() const {
  std::vector<std::string> ids;
  const std::string& root = budget_.jobRoot;
  for (const auto& [scope, bytes] : scopeBytes_)
    if (scope.size() > root.size() + 1 && scope.starts_with(root))
      ids.push_back(scope.substr(root.size(), scope.size() - root.size() - 1));
  std::sort(ids.begin(), ids.end());
  return ids;
}

void StoreCore::touched(const std::string& key, bool created, Wakeups& wakeups) {
  if (!observers_.empty()) {
    const Bytes* now = find(key);
    for (const WriteObserver& observe : observers_) observe(key, now);
  }
  if (created) {
    if (auto node = keyWaiters_.extract(key)) {
      for (WaiterId id : node.mapped()) {
        auto it = waiters_.find(id);
        if (it == waiters_.end()) continue;
        Waiter& w = it->second;
        if (--w.pendingKeys > 0) continue;
        // Every key it was missing has been created once; one may have been deleted since.
        registerMissing(id, w);
        if (w.pendingKeys > 0) continue;
        wakeups.push_back(std::move(w.ready));
        removeWaiter(id);
      }
    }
  }
  auto watchers = keyWatchers_.find(key);
  if (watchers == keyWatchers_.end()) return;
  const Bytes* now = find(key);
  std::optional<crypto::Digest> digest;  // of `now`, computed once, only if a size matches
  std::vector<WaiterId> fired;
  for (WaiterId id : watchers->second) {
    const Waiter& w = waiters_.at(id);
    bool differs = !now || !w.known || w.known->size != now->size();
    if (now && !differs) {
      if (!digest) digest = crypto::sha256(*now);
      differs = !crypto::equalDigests(*digest, w.known->digest);
    }
    if (now ? differs : w.known.has_value()) fired.push_back(id);
  }
  if (fired.empty()) return;
  // One copy of the value for every watcher woken (thousands may watch one key).
  auto value = std::make_shared<const std::optional<Bytes>>(now ? std::optional<Bytes>(*now)
                                                                 : std::nullopt);
  for (WaiterId id : fired) {
    auto changed = std::move(waiters_.at(id).changed);
    wakeups.push_back([changed = std::move(changed), value] { changed(*value); });
    removeWaiter(id);
  }
}

void StoreCore::registerMissing(WaiterId id, Waiter& w) {
  w.pendingKeys = 0;
  for (const auto& k : w.keys) {
    if (data_.count(k)) continue;
    // A key listed twice counts once per listing; both registrations fire on creation.
    if (keyWaiters_[k].insert(id).second) ++w.pendingKeys;
  }
}

StoreCore::WaiterId StoreCore::waitFor(ClientId client, std::vector<std::string> keys,
                                       std::function<void()> ready) {
  validateKeyCount(keys.size());
  for (const auto& k : keys) validateKey(k);
  if (check(keys)) return 0;
  WaiterId id = ++lastWaiter_;
  Waiter& w = waiters_[id];
  w.client = client;
  w.keys = std::move(keys);
  w.ready = std::move(ready);
  registerMissing(id, w);
  clientWaiters_[client].insert(id);
  return id;
}

bool StoreCore::differs(const std::string& key, const std::optional<KnownValue>& known) const {
  const Bytes* now = find(key);
  return now ? (!known || !known->matches(*now)) : known.has_value();
}

StoreCore::WaiterId StoreCore::watch(ClientId client, std::string key,
                                     const std::optional<Bytes>& known,
                                     std::function<void(const std::optional<Bytes>&)> changed) {
  validateKey(key);
  const Bytes* now = find(key);
  if (now ? (!known || *known != *now) : known.has_value()) return 0;  // no digest needed
  return watch(client, std::move(key), KnownValue::of(known), std::move(changed));
}

StoreCore::WaiterId StoreCore::watch(ClientId client, std::string key,
                                     std::optional<KnownValue> known,
                                     std::function<void(const std::optional<Bytes>&)> changed) {
  validateKey(key);
  if (differs(key, known)) return 0;
  WaiterId id = ++lastWaiter_;
  Waiter& w = waiters_[id];
  w.client = client;
  w.isWatch = true;
  w.known = std::move(known);
  w.changed = std::move(changed);
  keyWatchers_[key].insert(id);
  w.keys.push_back(std::move(key));
  clientWaiters_[client].insert(id);
  return id;
}

void StoreCore::removeWaiter(WaiterId id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return;
  Waiter& w = it->second;
  auto& index = w.isWatch ? keyWatchers_ : keyWaiters_;
  for (const auto& k : w.keys) {
    auto set = index.find(k);
    if (set == index.end()) continue;
    set->second.erase(id);
    if (set->second.empty()) index.erase(set);
  }
  if (auto c = clientWaiters_.find(w.client); c != clientWaiters_.end()) {
    c->second.erase(id);
    if (c->second.empty()) clientWaiters_.erase(c);
  }
  waiters_.erase(it);
}

void StoreCore::cancel(WaiterId id) { removeWaiter(id); }

void StoreCore::setWill(ClientId client, Will will) {
  size_t entries = will.sets.size() + will.adds.size() + will.deletes.size();
  validateKeyCount(entries);
  for (const auto& [k, v] : will.sets) {
    validateKey(k);
    validateValue(k, v);
  }
  for (const auto& [k, d] : will.adds) validateKey(k);
  for (const auto& k : will.deletes) validateKey(k);
  if (entries == 0)
    wills_.erase(client);
  else
    wills_[client] = std::move(will);
}

void StoreCore::clearWill(ClientId client) { wills_.erase(client); }

bool StoreCore::clientGone(ClientId client) {
  if (auto c = clientWaiters_.find(client); c != clientWaiters_.end()) {
    std::vector<WaiterId> ids(c->second.begin(), c->second.end());
    for (WaiterId id : ids) removeWaiter(id);
  }
  auto node = wills_.extract(client);
  if (!node) return false;
  const Will& will = node.mapped();
  Wakeups wakeups;
  for (const auto& [k, v] : will.sets) {
    try {
      checkGrowth(k, growthOf(k, v.size()));
      setLocked(k, v, wakeups);
    } catch (const InvalidArgument&) {
      // Over the store's budget: skipped like an add the store refuses; the rest still runs.
    }
  }
  for (const auto& [k, d] : will.adds) {
    try {
      addLocked(k, d, wakeups);
    } catch (const InvalidArgument&) {
      // The key now holds a non-integer: nothing sensible to add; the rest of the will still runs.
    }
  }
  for (const auto& k : will.deletes) eraseLocked(k, wakeups);
  run(wakeups);
  return true;
}

std::vector<std::string> StoreCore::prefixesWithoutWill(const std::string& root) const {
  // "<root><job>/" of a key under root, or "" when the key has no job part.
  auto jobOf = [&](std::string_view key) -> std::string_view {
    if (key.size() <= root.size() || key.compare(0, root.size(), root) != 0) return {};
    size_t slash = key.find('/', root.size());
    return slash == std::string_view::npos ? std::string_view{} : key.substr(0, slash + 1);
  };
  std::unordered_set<std::string_view> named;
  for (const auto& [client, will] : wills_) {
    for (const auto& [k, v] : will.sets) named.insert(jobOf(k));
    for (const auto& [k, d] : will.adds) named.insert(jobOf(k));
    for (const auto& k : will.deletes) named.insert(jobOf(k));
  }
  std::vector<std::string> orphans;
  for (auto it = data_.lower_bound(root); it != data_.end();) {
    std::string_view job = jobOf(it->first);
    if (job.empty()) {
      if (it->first.compare(0, root.size(), root) != 0) break;  // past the root's range
      ++it;
      continue;
    }
    if (!named.count(job)) orphans.emplace_back(job);
    // Skip the rest of this job's keys: the first key after "<job>/" + every byte.
    std::string next(job);
    next.back() = static_cast<char>('/' + 1);
    it = data_.lower_bound(next);
  }
  return orphans;
}

}  // namespace drun::rdzv

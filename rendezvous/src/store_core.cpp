#include "drun/rendezvous/store_core.hpp"

#include <charconv>
#include <limits>

#include "drun/common/error.hpp"

namespace drun::rdzv {
namespace {

std::string shown(const std::string& key) {
  constexpr size_t kShown = 64;
  return key.size() <= kShown ? key : key.substr(0, kShown) + "...";
}

int64_t parseStoredInt(const std::string& key, const Bytes& value) {
  int64_t parsed = 0;
  const char* first = value.data();
  const char* last = value.data() + value.size();
  if (first != last && *first == '+') ++first;
  auto [ptr, ec] = std::from_chars(first, last, parsed);
  if (first == last || ec != std::errc() || ptr != last)
    throw InvalidArgument("add on key '" + shown(key) + "': stored value '" + shown(value) +
                          "' is not a decimal integer");
  return parsed;
}

}  // namespace

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
  Wakeups wakeups;
  setLocked(key, std::move(value), wakeups);
  run(wakeups);
}

void StoreCore::setLocked(const std::string& key, Bytes value, Wakeups& wakeups) {
  auto [it, created] = data_.try_emplace(key);
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
    throw InvalidArgument("add on key '" + shown(key) + "': " + std::to_string(value) + " + " +
                          std::to_string(delta) + " overflows int64");
  setLocked(key, std::to_string(sum), wakeups);
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
  if (data_.erase(key) == 0) return false;
  touched(key, false, wakeups);
  return true;
}

void StoreCore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size())
    throw InvalidArgument("multiSet: " + std::to_string(keys.size()) + " keys but " +
                          std::to_string(values.size()) + " values");
  validateKeyCount(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    validateKey(keys[i]);
    validateValue(keys[i], values[i]);
  }
  Wakeups wakeups;
  for (size_t i = 0; i < keys.size(); ++i) setLocked(keys[i], values[i], wakeups);
  run(wakeups);
}

void StoreCore::append(const std::string& key, const Bytes& value) {
  validateKey(key);
  const Bytes* current = find(key);
  size_t size = (current ? current->size() : 0) + value.size();
  if (size > limits_.maxValueBytes)
    throw InvalidArgument("append to key '" + shown(key) + "' would make it " +
                          std::to_string(size) + " bytes, over the limit of " +
                          std::to_string(limits_.maxValueBytes));
  Wakeups wakeups;
  auto [it, created] = data_.try_emplace(key);
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
    it = data_.erase(it);
    ++removed;
    touched(key, false, wakeups);
  }
  run(wakeups);
  return removed;
}

void StoreCore::touched(const std::string& key, bool created, Wakeups& wakeups) {
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
  std::vector<WaiterId> fired;
  for (WaiterId id : watchers->second) {
    const Waiter& w = waiters_.at(id);
    bool differs = now ? (!w.known || *w.known != *now) : w.known.has_value();
    if (differs) fired.push_back(id);
  }
  std::optional<Bytes> value = now ? std::optional<Bytes>(*now) : std::nullopt;
  for (WaiterId id : fired) {
    auto changed = std::move(waiters_.at(id).changed);
    wakeups.push_back([changed = std::move(changed), value] { changed(value); });
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

StoreCore::WaiterId StoreCore::watch(ClientId client, std::string key, std::optional<Bytes> known,
                                     std::function<void(const std::optional<Bytes>&)> changed) {
  validateKey(key);
  const Bytes* now = find(key);
  bool differs = now ? (!known || *known != *now) : known.has_value();
  if (differs) return 0;
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
  for (const auto& [k, v] : will.sets) setLocked(k, v, wakeups);
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

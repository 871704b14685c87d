// A Store key as a family of etcd keys (etcd_keyspace.hpp).
#include "etcd_keyspace.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdio>
#include <random>

#include <unistd.h>

#include "drun/common/error.hpp"

namespace drun::rdzv::etcd_keys {

std::string familyEnd(const std::string& key) { return key + '\x01'; }
std::string generatedStart(const std::string& key) { return key + '\0'; }
std::string incrementKey(const std::string& key) { return key + std::string("\0+", 2); }
std::string decrementKey(const std::string& key) { return key + std::string("\0-", 2); }
std::string appendKey(const std::string& key, const std::string& id) {
  return key + std::string("\0a", 2) + id;
}

std::string uniqueId() {
  // A random part drawn once per process, the pid (a forked child shares the random part and
  // the counter), and a counter.
  static const unsigned long long process = [] {
    std::random_device rd;
    return (static_cast<unsigned long long>(rd()) << 32) ^ rd();
  }();
  static std::atomic<unsigned long long> next{0};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%016llx.%x.%llx", process, static_cast<unsigned>(::getpid()),
                next.fetch_add(1));
  return buf;
}

std::optional<int64_t> parseInteger(const std::string& text) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

std::optional<std::string> foldFamily(const std::string& key, const std::vector<EtcdKeyValue>& family) {
  const EtcdKeyValue* base = nullptr;
  int64_t counted = 0;
  bool counter = false;
  std::vector<const EtcdKeyValue*> appended;
  for (const EtcdKeyValue& kv : family) {
    if (kv.key == key) {
      base = &kv;
    } else if (kv.key == incrementKey(key)) {
      counted += kv.version;
      counter = true;
    } else if (kv.key == decrementKey(key)) {
      counted -= kv.version;
      counter = true;
    } else if (kv.key.compare(0, key.size() + 2, appendKey(key, "")) == 0) {
      appended.push_back(&kv);
    }
  }
  if (!base && !counter && appended.empty()) return std::nullopt;
  if (counter) {
    const std::optional<int64_t> set = base ? parseInteger(base->value) : std::optional<int64_t>(0);
    if (set) return std::to_string(*set + counted);
    return base->value;
  }
  std::sort(appended.begin(), appended.end(), [](const EtcdKeyValue* a, const EtcdKeyValue* b) {
    return a->createRevision < b->createRevision;
  });
  std::string value = base ? base->value : std::string();
  for (const EtcdKeyValue* kv : appended) value += kv->value;
  return value;
}

std::string familyOf(const std::string& etcdKey) { return etcdKey.substr(0, etcdKey.find('\0')); }

int64_t familiesIn(const std::vector<EtcdKeyValue>& kvs) {
  int64_t count = 0;
  std::string last;
  for (const EtcdKeyValue& kv : kvs) {
    std::string family = familyOf(kv.key);
    if (count == 0 || family != last) ++count;
    last = std::move(family);
  }
  return count;
}

bool isEmptyWill(const Store::Will& will) {
  return will.sets.empty() && will.adds.empty() && will.deletes.empty();
}

void checkKey(const std::string& key) {
  if (key.find('\0') != std::string::npos)
    throw InvalidArgument("etcd store: a key may not contain a NUL byte");
}

}  // namespace drun::rdzv::etcd_keys

// EtcdStore: the Store contract over etcd transactions and watches (etcd_store.hpp).
#include "drun/rendezvous/etcd_store.hpp"

#include <charconv>
#include <map>
#include <random>
#include <thread>

#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"
#include "etcd_session.hpp"

namespace drun::rdzv {
namespace {

std::string keyList(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size() && i < 8; ++i) out += (i ? ", " : "") + keys[i];
  if (keys.size() > 8) out += ", ... (" + std::to_string(keys.size()) + " keys)";
  return out + "]";
}

// A random pause after a lost compare-and-set race, its range doubling with the attempts (1 ms
// to 100 ms, as Ethernet's backoff): N racers spread out within about log2(N) attempts instead of
// all proposing again at once (every failed transaction is a raft proposal too; without the
// spread N racers cost about N^2/2 of them).
void backOff(int attempt) {
  thread_local std::mt19937 jitter(std::random_device{}());
  const unsigned rangeUs = std::min(1000u << std::min(attempt, 7), 100000u);
  std::this_thread::sleep_for(std::chrono::microseconds(jitter() % rangeUs));
}

constexpr int kMaxRaces = 4096;
// etcd refuses a transaction of more operations than its --max-txn-ops (128 by default).
constexpr size_t kMaxOpsPerTxn = 128;

// Reads the keys in transactions of at most kMaxOpsPerTxn ranges; one range result per key.
std::vector<EtcdRange> readAll(EtcdClient& client, const std::vector<std::string>& keys) {
  std::vector<EtcdRange> out;
  for (size_t at = 0; at < keys.size(); at += kMaxOpsPerTxn) {
    std::vector<EtcdOp> reads;
    for (size_t i = at; i < std::min(keys.size(), at + kMaxOpsPerTxn); ++i)
      reads.push_back(EtcdOp::range(keys[i]));
    EtcdTxnResult result = client.txn({}, reads, {}, true);
    for (auto& r : result.ranges) out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

EtcdStore::EtcdStore(std::shared_ptr<EtcdSession> session) : session_(std::move(session)) {
  if (!session_) throw InvalidArgument("etcd store: no session");
  client_ = std::make_unique<EtcdClient>(session_->options().client);
  session_->attach(client_.get());
}

EtcdStore::~EtcdStore() {
  session_->detach(client_.get());
  if (!ownsWill_) return;
  try {
    // A clean close: this store's will runs now, as a store server runs a closed connection's.
    EtcdClientOptions quick = session_->options().client;
    quick.callTimeout = std::min<milliseconds>(quick.callTimeout, session_->ttl());
    EtcdClient closer(quick);
    session_->runOwnWill(closer);
  } catch (const std::exception& e) {
    spdlog::debug("etcd store: running this node's will on close: {} (it runs when the lease ends)",
                  e.what());
  }
}

std::string EtcdStore::k(const std::string& key) const { return session_->kvPrefix() + key; }

void EtcdStore::checkLease() const {
  if (session_->lost())
    throw NetworkError("etcd store: this agent lost its etcd lease: " + session_->lostReason());
}

void EtcdStore::interrupt() { client_->interrupt(); }

void EtcdStore::set(const std::string& key, const Bytes& value) {
  checkLease();
  client_->put(k(key), value);
}

std::optional<Bytes> EtcdStore::tryGet(const std::string& key) {
  checkLease();
  EtcdRange r = client_->range(k(key));
  if (r.kvs.empty()) return std::nullopt;
  return std::move(r.kvs.front().value);
}

std::optional<Bytes> EtcdStore::watch(const std::string& key, const std::optional<Bytes>& known,
                                      milliseconds timeout) {
  checkLease();
  const Deadline deadline(timeout);
  const EtcdRange now = client_->range(k(key));
  std::optional<Bytes> value;
  if (!now.kvs.empty()) value = now.kvs.front().value;
  if (value != known) return value;
  try {
    client_->watch(k(key), {}, now.revision + 1, deadline, [&](const std::vector<EtcdWatchEvent>& events) {
      for (const EtcdWatchEvent& event : events) {
        std::optional<Bytes> next;
        if (!event.deleted) next = event.kv.value;
        if (next != known) {
          value = std::move(next);
          return false;
        }
      }
      return true;
    });
  } catch (const TimeoutError&) {
    checkLease();
    throw TimeoutError("watch timed out after " + std::to_string(timeout.count()) + "ms on [" + key +
                       "] at etcd " + client_->endpointName());
  } catch (const NetworkError&) {
    checkLease();  // a lost lease says why
    throw;
  }
  return value;
}

Bytes EtcdStore::get(const std::string& key, milliseconds timeout) {
  checkLease();
  const Deadline deadline(timeout);
  for (;;) {
    const EtcdRange now = client_->range(k(key));
    if (!now.kvs.empty()) return now.kvs.front().value;
    std::optional<Bytes> value;
    try {
      client_->watch(k(key), {}, now.revision + 1, deadline, [&](const std::vector<EtcdWatchEvent>& events) {
        for (const EtcdWatchEvent& event : events)
          if (!event.deleted) value = event.kv.value;
        return !value.has_value();
      });
    } catch (const TimeoutError&) {
      checkLease();
      throw TimeoutError("get timed out after " + std::to_string(timeout.count()) + "ms on [" + key +
                         "] at etcd " + client_->endpointName());
    }
    if (value) return *value;
  }
}

void EtcdStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  const Deadline deadline(timeout);
  for (const std::string& key : keys) {
    try {
      get(key, deadline.remaining());
    } catch (const TimeoutError&) {
      std::vector<std::string> missing;
      for (const std::string& other : keys)
        if (!check({other})) missing.push_back(other);
      throw TimeoutError("wait timed out after " + std::to_string(timeout.count()) + "ms on " +
                         keyList(missing) + " at etcd " + client_->endpointName());
    }
  }
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  checkLease();
  std::vector<std::string> full;
  for (const std::string& key : keys) full.push_back(k(key));
  for (const EtcdRange& r : readAll(*client_, full))
    if (r.kvs.empty()) return false;
  return true;
}

std::vector<Bytes> EtcdStore::multiGet(const std::vector<std::string>& keys, milliseconds timeout) {
  const Deadline deadline(timeout);
  for (;;) {
    wait(keys, deadline.remaining());
    // One read of them all, consistent up to 128 keys (a key deleted meanwhile: wait again).
    std::vector<std::string> full;
    for (const std::string& key : keys) full.push_back(k(key));
    std::vector<Bytes> values;
    for (const EtcdRange& r : readAll(*client_, full)) {
      if (r.kvs.empty()) break;
      values.push_back(r.kvs.front().value);
    }
    if (values.size() == keys.size()) return values;
  }
}

void EtcdStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  checkLease();
  if (keys.size() != values.size()) throw InvalidArgument("multiSet: keys and values differ in count");
  // etcd refuses a key twice in one transaction: each key once, with its last value, in the
  // order of its last occurrence. Over kMaxOpsPerTxn keys, several transactions in that order:
  // what a caller writes last (a round's status, after its assignments) is still written last.
  std::map<std::string, size_t> lastAt;
  for (size_t i = 0; i < keys.size(); ++i) lastAt[keys[i]] = i;
  std::vector<EtcdOp> writes;
  for (size_t i = 0; i < keys.size(); ++i)
    if (lastAt[keys[i]] == i) writes.push_back(EtcdOp::put(k(keys[i]), values[i]));
  for (size_t at = 0; at < writes.size(); at += kMaxOpsPerTxn) {
    std::vector<EtcdOp> chunk(writes.begin() + at, writes.begin() + std::min(writes.size(), at + kMaxOpsPerTxn));
    client_->txn({}, chunk, {}, true);
  }
}

bool EtcdStore::deleteKey(const std::string& key) {
  checkLease();
  return client_->deleteRange(k(key)) > 0;
}

int64_t EtcdStore::numKeys() {
  checkLease();
  const std::string& prefix = session_->kvPrefix();
  return client_->range(prefix, EtcdClient::prefixEnd(prefix), true).count;
}

int64_t EtcdStore::deletePrefix(const std::string& prefix) {
  checkLease();
  if (prefix.empty()) throw InvalidArgument("deletePrefix: empty prefix");
  return client_->deleteRange(k(prefix), EtcdClient::prefixEnd(k(prefix)));
}

// Reads the key, computes the new value, writes it if the key did not change meanwhile (a
// transaction on its mod revision); a lost race reads again. Not idempotent: a write whose answer
// was lost is not repeated (NetworkError), since it may have been applied.
template <class Update>
Bytes EtcdStore::readModifyWrite(const std::string& key, const char* what, Update update) {
  checkLease();
  const std::string full = k(key);
  EtcdRange current = client_->range(full);
  for (int attempt = 0; attempt < kMaxRaces; ++attempt) {
    const bool absent = current.kvs.empty();
    const std::optional<Bytes> before = absent ? std::nullopt : std::optional<Bytes>(current.kvs.front().value);
    const Bytes after = update(before);
    const EtcdCompare unchanged{full, absent ? EtcdCompare::Target::CreateRevision : EtcdCompare::Target::ModRevision,
                                {}, absent ? 0 : current.kvs.front().modRevision};
    EtcdTxnResult result = client_->txn({unchanged}, {EtcdOp::put(full, after)}, {EtcdOp::range(full)}, false);
    if (result.succeeded) return after;
    current = std::move(result.ranges.front());
    backOff(attempt);
  }
  throw Error(std::string(what) + " on [" + key + "]: lost " + std::to_string(kMaxRaces) +
              " races in a row at etcd " + client_->endpointName());
}

int64_t EtcdStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  readModifyWrite(key, "add", [&](const std::optional<Bytes>& before) {
    int64_t value = 0;
    if (before) {
      auto [end, ec] = std::from_chars(before->data(), before->data() + before->size(), value);
      if (ec != std::errc() || end != before->data() + before->size() || before->empty())
        throw InvalidArgument("add on [" + key + "]: the value is not an integer");
    }
    result = value + delta;
    return std::to_string(result);
  });
  return result;
}

void EtcdStore::append(const std::string& key, const Bytes& value) {
  readModifyWrite(key, "append", [&](const std::optional<Bytes>& before) { return before.value_or("") + value; });
}

Bytes EtcdStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  checkLease();
  const std::string full = k(key);
  for (int attempt = 0; attempt < kMaxRaces; ++attempt) {
    // An empty `expected` also matches a missing key (torch's TCPStore).
    const bool missingMatches = expected.empty() && attempt % 2 == 0;
    const EtcdCompare compare = missingMatches
                                    ? EtcdCompare{full, EtcdCompare::Target::CreateRevision, {}, 0}
                                    : EtcdCompare{full, EtcdCompare::Target::Value, expected, 0};
    const EtcdTxnResult result = client_->txn({compare}, {EtcdOp::put(full, desired)}, {EtcdOp::range(full)}, true);
    if (result.succeeded) return desired;
    const EtcdRange& now = result.ranges.front();
    if (now.kvs.empty()) {
      if (!expected.empty()) return expected;  // missing + non-empty expected: nothing stored
      continue;                                // deleted meanwhile: the missing-key form again
    }
    const Bytes& stored = now.kvs.front().value;
    if (stored != expected) return stored;
    // It holds `expected` now (an empty value when the missing form lost): compare the value.
    if (!expected.empty()) backOff(attempt);
  }
  throw Error("compareSet on [" + key + "]: lost " + std::to_string(kMaxRaces) + " races at etcd");
}

void EtcdStore::setWill(const Will& will) {
  checkLease();
  session_->setWill(*client_, will);
  ownsWill_ = !(will.sets.empty() && will.adds.empty() && will.deletes.empty());
}

}  // namespace drun::rdzv

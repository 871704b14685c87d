// EtcdStore: the Store contract over etcd transactions and watches (etcd_store.hpp); a key is a
// family of etcd keys (etcd_keyspace.hpp).
#include "drun/etcd/etcd_store.hpp"

#include <algorithm>
#include <map>
#include <random>
#include <thread>

#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"
#include "etcd_keyspace.hpp"
#include "etcd_session.hpp"

namespace drun::rdzv {
namespace {

using namespace etcd_keys;

std::string keyList(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size() && i < 8; ++i) out += (i ? ", " : "") + keys[i];
  if (keys.size() > 8) out += ", ... (" + std::to_string(keys.size()) + " keys)";
  return out + "]";
}

// A random pause after a lost compare-and-set race, its range doubling with the attempts (1 ms
// to 100 ms, as Ethernet's backoff). Only writers that replace a value race (compareSet, an
// add of a delta other than +-1); adds of +-1 and appends never do.
void backOff(int attempt) {
  thread_local std::mt19937 jitter(std::random_device{}());
  const unsigned rangeUs = std::min(1000u << std::min(attempt, 7), 100000u);
  std::this_thread::sleep_for(std::chrono::microseconds(jitter() % rangeUs));
}

constexpr int kMaxRaces = 4096;

// Reads the keys' families in transactions of at most kEtcdMaxOpsPerTxn ranges; one value per key.
std::vector<std::optional<Bytes>> readAll(EtcdClient& client, const std::vector<std::string>& keys) {
  std::vector<std::optional<Bytes>> out;
  for (size_t at = 0; at < keys.size(); at += kEtcdMaxOpsPerTxn) {
    std::vector<EtcdOp> reads;
    for (size_t i = at; i < std::min(keys.size(), at + kEtcdMaxOpsPerTxn); ++i)
      reads.push_back(EtcdOp::range(keys[i], familyEnd(keys[i])));
    EtcdTxnResult result = client.txn({}, reads, {}, true);
    for (size_t i = 0; i < result.ranges.size(); ++i) out.push_back(foldFamily(keys[at + i], result.ranges[i].kvs));
  }
  return out;
}

// The value that replaces a family: its key set, everything generated for it removed.
std::vector<EtcdOp> replaceFamily(const std::string& key, const Bytes& value) {
  return {EtcdOp::put(key, value), EtcdOp::erase(generatedStart(key), familyEnd(key))};
}

// The key K of a family as it is now (absent: created revision 0), for a compare.
EtcdCompare unchangedKey(const std::string& key, const std::vector<EtcdKeyValue>& family) {
  for (const EtcdKeyValue& kv : family)
    if (kv.key == key) return {key, EtcdCompare::Target::ModRevision, {}, kv.modRevision};
  return {key, EtcdCompare::Target::CreateRevision, {}, 0};
}

}  // namespace

EtcdStore::EtcdStore(std::shared_ptr<EtcdSession> session) : session_(std::move(session)) {
  if (!session_) throw InvalidArgument("etcd store: no session");
  client_ = std::make_unique<EtcdClient>(session_->clientOptions());
  session_->attach(client_.get());
}

EtcdStore::~EtcdStore() {
  session_->detach(client_.get());
  if (!ownsWill_) return;
  try {
    // A clean close: this store's will runs now, as a store server runs a closed connection's.
    EtcdClientOptions quick = session_->clientOptions();
    quick.callTimeout = std::min<milliseconds>(quick.callTimeout, session_->ttl());
    EtcdClient closer(quick);
    session_->runOwnWill(closer);
  } catch (const std::exception& e) {
    spdlog::debug("etcd store: running this node's will on close: {} (it runs when the lease ends)",
                  e.what());
  }
}

std::string EtcdStore::k(const std::string& key) const {
  checkKey(key);
  return session_->kvPrefix() + key;
}

void EtcdStore::checkLease() const {
  if (session_->lost())
    throw NetworkError("etcd store: this agent lost its etcd lease: " + session_->lostReason());
}

void EtcdStore::interrupt() { client_->interrupt(); }

void EtcdStore::set(const std::string& key, const Bytes& value) {
  checkLease();
  session_->checkWritable();
  client_->txn({}, replaceFamily(k(key), value), {}, true);
}

std::optional<Bytes> EtcdStore::tryGet(const std::string& key) {
  checkLease();
  const std::string full = k(key);
  return foldFamily(full, client_->range(full, familyEnd(full)).kvs);
}

// Reads the family of `full`, then follows it in a watch until `done` holds for its value, which
// it returns. The watch's events replay every change after the read, so the family kept here is
// the family as etcd holds it after each batch. The watch is opened "from now" while nothing was
// written since the read (etcd_client.hpp: watchFromNow), where one from the read's revision
// could wait up to 100 ms for etcd's catch-up loop: a job's end is a burst of writes, and each
// watcher that looks again in it would. TimeoutError at the deadline.
// A wait in slices (a round's status, watched until a progress line or the last call is due,
// then again) resumes where the slice that timed out left it: the family as it knew it and the
// revision it knew it at, watched from the next one, with no read (lastLook_). A resumed family
// whose value is already `done` is read afresh instead.
template <class Done>
std::optional<Bytes> EtcdStore::awaitValue(const std::string& full, const Deadline& deadline, Done done) {
  std::map<std::string, EtcdKeyValue> family;
  int64_t known = 0;  // the revision `family` is as etcd held it at
  {
    std::lock_guard lock(lookMutex_);
    if (lastLook_ && lastLook_->key == full) {
      family = std::move(lastLook_->family);
      known = lastLook_->revision;
    }
    lastLook_.reset();
  }
  auto fold = [&] {
    std::vector<EtcdKeyValue> kvs;
    for (const auto& [name, kv] : family) kvs.push_back(kv);
    return foldFamily(full, kvs);
  };
  std::optional<Bytes> value = fold();
  const bool resumed = known > 0 && !done(value);
  if (!resumed) {
    const EtcdRange now = client_->range(full, familyEnd(full));
    family.clear();
    for (const EtcdKeyValue& kv : now.kvs) family[kv.key] = kv;
    known = now.revision;
    value = fold();
    if (done(value)) return value;
  }
  int64_t seen = known;
  auto follow = [&](const std::vector<EtcdWatchEvent>& events) {
    for (const EtcdWatchEvent& event : events) {
      seen = std::max(seen, event.kv.modRevision);
      if (event.deleted)
        family.erase(event.kv.key);
      else
        family[event.kv.key] = event.kv;
    }
    value = fold();
    return !done(value);
  };
  try {
    if (!resumed && client_->watchFromNow(full, familyEnd(full), known + 1, deadline, follow)) return value;
    // The store moved on before the watch began (other agents write: a busy round does at every
    // revision), or a resumed wait: from the revision known, at etcd's pace, rather than read
    // again (a read and a watch more per look, for every waiter, as long as the round's writes go on).
    client_->watch(full, familyEnd(full), known + 1, deadline, follow);
  } catch (const TimeoutError&) {
    if (family.size() <= kLookFamilyLimit) {
      std::lock_guard lock(lookMutex_);
      lastLook_ = LastLook{full, seen, std::move(family)};
    }
    throw;
  }
  return value;
}

std::optional<Bytes> EtcdStore::watch(const std::string& key, const std::optional<Bytes>& known,
                                      milliseconds timeout) {
  checkLease();
  try {
    return awaitValue(k(key), Deadline(timeout), [&](const std::optional<Bytes>& value) { return value != known; });
  } catch (const TimeoutError&) {
    checkLease();
    throw TimeoutError("watch timed out after " + std::to_string(timeout.count()) + "ms on [" + key +
                       "] at etcd " + client_->endpointName());
  } catch (const NetworkError&) {
    checkLease();  // a lost lease says why
    throw;
  }
}

Bytes EtcdStore::get(const std::string& key, milliseconds timeout) {
  checkLease();
  try {
    return *awaitValue(k(key), Deadline(timeout), [](const std::optional<Bytes>& value) { return value.has_value(); });
  } catch (const TimeoutError&) {
    checkLease();
    throw TimeoutError("get timed out after " + std::to_string(timeout.count()) + "ms on [" + key +
                       "] at etcd " + client_->endpointName());
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
  for (const std::optional<Bytes>& value : readAll(*client_, full))
    if (!value) return false;
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
    for (std::optional<Bytes>& value : readAll(*client_, full)) {
      if (!value) break;
      values.push_back(std::move(*value));
    }
    if (values.size() == keys.size()) return values;
  }
}

void EtcdStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  checkLease();
  session_->checkWritable();
  if (keys.size() != values.size()) throw InvalidArgument("multiSet: keys and values differ in count");
  // etcd refuses a key twice in one transaction: each key once, with its last value, in the
  // order of its last occurrence. Over kEtcdMaxOpsPerTxn ops, several transactions in that order:
  // what a caller writes last (a round's status, after its assignments) is still written last.
  std::map<std::string, size_t> lastAt;
  for (size_t i = 0; i < keys.size(); ++i) lastAt[keys[i]] = i;
  std::vector<EtcdOp> writes;
  for (size_t i = 0; i < keys.size(); ++i)
    if (lastAt[keys[i]] == i)
      for (EtcdOp& op : replaceFamily(k(keys[i]), values[i])) writes.push_back(std::move(op));
  for (size_t at = 0; at < writes.size(); at += kEtcdMaxOpsPerTxn) {  // even: a key's two ops together
    std::vector<EtcdOp> chunk(writes.begin() + at, writes.begin() + std::min(writes.size(), at + kEtcdMaxOpsPerTxn));
    client_->txn({}, chunk, {}, true);
  }
}

bool EtcdStore::deleteKey(const std::string& key) {
  checkLease();
  const std::string full = k(key);
  const RetryToken token = newToken();
  const Guarded done = guardedTxn(token, {}, {EtcdOp::erase(full, familyEnd(full))}, {});
  tokenAnswered(token);
  if (done.txn.succeeded) return done.txn.deletedBy.front() > 0;
  // Applied by an earlier attempt (the only compare is the token's): the key existed if its
  // family did just before.
  return !readAt(full, familyEnd(full), done.appliedAt - 1, "deleteKey on [" + key + "]").empty();
}

int64_t EtcdStore::numKeys() {
  checkLease();
  const std::string& prefix = session_->kvPrefix();
  return familiesIn(client_->range(prefix, EtcdClient::prefixEnd(prefix)).kvs);
}

int64_t EtcdStore::deletePrefix(const std::string& prefix) {
  checkLease();
  if (prefix.empty()) throw InvalidArgument("deletePrefix: empty prefix");
  const std::string full = k(prefix);
  const std::string end = EtcdClient::prefixEnd(full);
  // The keys removed, read in the same transaction: a count of Store keys, not of etcd keys.
  const RetryToken token = newToken();
  const Guarded done = guardedTxn(token, {}, {EtcdOp::range(full, end), EtcdOp::erase(full, end)}, {});
  tokenAnswered(token);
  if (done.txn.succeeded) return familiesIn(done.txn.ranges.front().kvs);
  return familiesIn(readAt(full, end, done.appliedAt - 1, "deletePrefix [" + prefix + "]"));
}

int64_t EtcdStore::add(const std::string& key, int64_t delta) {
  checkLease();
  const std::string full = k(key);
  const RetryToken token = newToken();
  const int64_t total = addOnce(key, full, delta, token);
  tokenAnswered(token);
  return total;
}

EtcdStore::RetryToken EtcdStore::newToken() {
  RetryToken token{session_->nextAppliedKey(), {}};
  std::lock_guard lock(tokensMutex_);
  token.stale.assign(finishedTokens_.begin(),
                     finishedTokens_.begin() + std::min<size_t>(finishedTokens_.size(), 32));
  return token;
}

void EtcdStore::tokenAnswered(const RetryToken& token) {
  std::lock_guard lock(tokensMutex_);
  std::erase_if(finishedTokens_, [&](const std::string& t) {
    return std::find(token.stale.begin(), token.stale.end(), t) != token.stale.end();
  });
  finishedTokens_.push_back(token.key);
}

EtcdStore::Guarded EtcdStore::guardedTxn(const RetryToken& token, std::vector<EtcdCompare> compares,
                                         std::vector<EtcdOp> success, std::vector<EtcdOp> failure) {
  compares.push_back({token.key, EtcdCompare::Target::CreateRevision, {}, 0});
  success.push_back(EtcdOp::put(token.key, "", session_->lease()));
  for (const std::string& old : token.stale) success.push_back(EtcdOp::erase(old));
  failure.push_back(EtcdOp::range(token.key));
  Guarded out;
  try {
    out.txn = client_->txn(compares, success, failure, true);
  } catch (const Error& e) {
    checkLease();  // a lost lease says why
    if (const auto* refused = dynamic_cast<const EtcdError*>(&e); refused && refused->leaseNotFound())
      throw NetworkError("etcd store: this agent's etcd lease ended: " + std::string(e.what()));
    throw;
  }
  if (!out.txn.succeeded && !out.txn.ranges.back().kvs.empty())
    out.appliedAt = out.txn.ranges.back().kvs.front().createRevision;
  return out;
}

std::vector<EtcdKeyValue> EtcdStore::readAt(const std::string& key, const std::string& end, int64_t revision,
                                            const std::string& what) {
  if (revision <= 0) throw ProtocolError(what + ": etcd refused a transaction, yet holds no token of it");
  try {
    return client_->range(key, end, false, false, revision).kvs;
  } catch (const Error& e) {
    throw NetworkError(what + ": applied at etcd revision " + std::to_string(revision) +
                       ", but what it saw there cannot be read: " + e.what());
  }
}

int64_t EtcdStore::addOnce(const std::string& key, const std::string& full, int64_t delta, const RetryToken& token) {
  auto notInteger = [&] { return InvalidArgument("add on [" + key + "]: the value is not an integer"); };
  auto totalOf = [&](const std::vector<EtcdKeyValue>& family) {
    const std::optional<int64_t> now = parseInteger(foldFamily(full, family).value_or(""));
    if (!now) throw notInteger();
    return *now;
  };
  // Guessed absent first (a counter's K is never set): one transaction in the usual case.
  std::vector<EtcdKeyValue> seen;
  for (int attempt = 0; attempt < kMaxRaces; ++attempt) {
    const EtcdCompare unchanged = unchangedKey(full, seen);
    std::optional<int64_t> base = 0;
    for (const EtcdKeyValue& kv : seen)
      if (kv.key == full) base = parseInteger(kv.value);
    if (!base) throw notInteger();
    // The total as read must take the delta (a counter alone never nears the limit).
    int64_t total = 0;
    if (!seen.empty() && __builtin_add_overflow(parseInteger(foldFamily(full, seen).value_or("0")).value_or(0), delta, &total))
      throw InvalidArgument("add on [" + key + "]: the value would overflow int64");
    // +-1: one more put of the family's counter (never refused); else K rewritten.
    std::vector<EtcdOp> apply{delta == 1    ? EtcdOp::put(incrementKey(full), "")
                              : delta == -1 ? EtcdOp::put(decrementKey(full), "")
                                            : EtcdOp::put(full, std::to_string(*base + delta)),
                              EtcdOp::range(full, familyEnd(full))};
    Guarded result = guardedTxn(token, {unchanged}, std::move(apply), {EtcdOp::range(full, familyEnd(full))});
    if (result.txn.succeeded) return totalOf(result.txn.ranges.front().kvs);
    // An earlier attempt of this add was applied and its reply lost: its total is the family
    // at the token's revision (the transaction's own).
    if (result.appliedAt) return totalOf(readAt(full, familyEnd(full), result.appliedAt, "add on [" + key + "]"));
    // K was set meanwhile (or exists: the guess was wrong): again on what it holds now.
    const bool wasGuess = seen.empty() && attempt == 0;
    seen = std::move(result.txn.ranges.front().kvs);
    if (!wasGuess) backOff(attempt);
  }
  throw Error("add on [" + key + "]: lost " + std::to_string(kMaxRaces) + " races in a row at etcd " +
              client_->endpointName());
}

void EtcdStore::append(const std::string& key, const Bytes& value) {
  checkLease();
  session_->checkWritable();
  const std::string full = k(key);
  // A key of its own, unique: repeating the put (its answer lost) writes the same thing again.
  client_->put(appendKey(full, uniqueId()), value);
}

Bytes EtcdStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  checkLease();
  const std::string full = k(key);
  const RetryToken token = newToken();
  for (int attempt = 0; attempt < kMaxRaces; ++attempt) {
    const EtcdRange now = client_->range(full, familyEnd(full));
    const std::optional<Bytes> value = foldFamily(full, now.kvs);
    // torch's TCPStore: an empty `expected` also matches a missing key; a missing key with a
    // non-empty `expected` stores nothing and returns `expected`.
    if (value ? *value != expected : !expected.empty()) return value ? *value : expected;
    // Replaced only if the family is as read: nothing in it written since, nothing removed.
    std::vector<EtcdCompare> compares{
        {full, EtcdCompare::Target::ModRevision, {}, now.revision + 1, familyEnd(full), EtcdCompare::Result::Less}};
    for (const EtcdKeyValue& kv : now.kvs)
      compares.push_back({kv.key, EtcdCompare::Target::ModRevision, {}, kv.modRevision});
    if (compares.size() >= kEtcdMaxOpsPerTxn - 1) compares.resize(1);  // many appends: checked as a whole
    // Under the token: a retry of an attempt that was applied (its reply lost) is this call's
    // win, whatever another writer stored since (a fresh read would tell a loss).
    const Guarded done = guardedTxn(token, std::move(compares), replaceFamily(full, desired), {});
    if (done.txn.succeeded || done.appliedAt) {
      tokenAnswered(token);
      return desired;
    }
    backOff(attempt);
  }
  throw Error("compareSet on [" + key + "]: lost " + std::to_string(kMaxRaces) + " races at etcd");
}

void EtcdStore::setWill(const Will& will) {
  checkLease();
  for (const auto& [key, value] : will.sets) checkKey(key);
  for (const auto& [key, delta] : will.adds) checkKey(key);
  for (const auto& key : will.deletes) checkKey(key);
  session_->setWill(*client_, will);
  ownsWill_ = !isEmptyWill(will);
}

}  // namespace drun::rdzv

#include "etcd_session.hpp"

#include <algorithm>
#include <cstdio>
#include <random>

#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"
#include "drun/common/fnv1a.hpp"
#include "drun/common/owned_thread.hpp"
#include "etcd_keyspace.hpp"

namespace drun::rdzv {
namespace {

std::string leaseName(int64_t lease) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(lease));
  return buf;
}

// The job lease's id: the same for every agent of the scope, whatever its build (FNV-1a of the
// prefix and the scope), positive as etcd's lease ids are.
int64_t jobLeaseId(const std::string& prefix, const std::string& scope) {
  const uint64_t hash = Fnv1a().mix(prefix).mix(std::string_view("\0", 1)).mix(scope).value;
  return static_cast<int64_t>((hash >> 1) | 1);
}

std::unique_ptr<EtcdClient> clientWith(EtcdClientOptions client, milliseconds callTimeout) {
  client.callTimeout = callTimeout;
  return std::make_unique<EtcdClient>(client);
}

}  // namespace

std::shared_ptr<EtcdSession> openEtcdSession(const EtcdStoreOptions& options) {
  return std::make_shared<EtcdSession>(options);
}
std::shared_ptr<EtcdSession> replaceLostEtcdSession(const EtcdStoreOptions& options, EtcdSession& lost) {
  lost.endLost(options.connectTimeout);  // the new session's deadline: etcd gone is gone as soon
  return openEtcdSession(options);
}
bool etcdSessionLost(const EtcdSession& session) { return session.lost(); }
milliseconds etcdSessionTtl(const EtcdSession& session) { return session.ttl(); }
void stopKeepAliveForTest(EtcdSession& session) { session.stopKeepAliveForTest(); }
void endLeaseForTest(EtcdSession& session) { session.endLeaseForTest(); }

EtcdSession::EtcdSession(const EtcdStoreOptions& options) : options_(options) {
  if (options_.prefix.empty()) throw InvalidArgument("etcd store: empty key prefix");
  if (options_.scope.empty() || options_.scope.find('/') != std::string::npos)
    throw InvalidArgument("etcd store: bad scope '" + options_.scope + "'");
  kvPrefix_ = options_.prefix + "kv/";
  willDir_ = options_.prefix + "will/" + options_.scope + "/";
  liveDir_ = options_.prefix + "live/" + options_.scope + "/";
  const auto seconds = std::max<int64_t>(1, (options_.leaseTtl.count() + 999) / 1000);
  if (options_.readOnly) {
    ttl_ = std::chrono::seconds(seconds);  // no lease: only the connections' silence probes use it
    options_.client.readsFromAnyMember = true;
    ownId_ = "read-only";
    watchClient_ = clientWith(clientOptions(), options_.client.callTimeout);
    applyClient_ = clientWith(clientOptions(), options_.client.callTimeout);
    keepAliveClient_ = clientWith(clientOptions(), options_.client.callTimeout);
    return;
  }
  EtcdClientOptions grantOptions = options_.client;
  grantOptions.callTimeout = options_.connectTimeout;
  grantOptions.silentPeerTimeout = std::chrono::seconds(seconds);  // as asked (etcd may raise it)
  EtcdClient granter(grantOptions);
  grantedAt_ = Clock::now();
  std::chrono::seconds granted{0};
  lease_ = granter.leaseGrant(std::chrono::seconds(seconds), &granted);
  ttl_ = granted;
  ownId_ = leaseName(lease_);
  if (options_.jobLeaseTtl > milliseconds(0)) {
    jobTtl_ = std::chrono::seconds(std::max<int64_t>(1, (options_.jobLeaseTtl.count() + 999) / 1000));
    jobLease_ = jobLeaseId(options_.prefix, options_.scope);
    granter.leaseGrantWithId(jobLease_, jobTtl_);  // false: another agent of the job granted it
  }
  appliedDir_ = options_.prefix + "applied/" + ownId_ + "/";
  // A keep-alive call may take a third of the TTL and asks each member once: the keep-alive
  // thread paces the retries (keepAliveRetryAt); the others the store's usual deadline.
  EtcdClientOptions keepAliveOptions = clientOptions();
  keepAliveOptions.singlePass = true;
  keepAliveClient_ = clientWith(keepAliveOptions, std::max<milliseconds>(ttl_ / 3, milliseconds(500)));
  watchClient_ = clientWith(clientOptions(), options_.client.callTimeout);
  applyClient_ = clientWith(clientOptions(), options_.client.callTimeout);
  keepAliveThread_ = spawnThreadWithSignalsBlocked([this] { keepAlive(); });
  spdlog::debug("etcd session: lease {} (TTL {} s) via {}", ownId_, granted.count(), granter.endpointName());
}

EtcdSession::~EtcdSession() {
  spdlog::trace("etcd session {}: closing", ownId_);
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  keepAliveClient_->interrupt();
  watchClient_->interrupt();
  applyClient_->interrupt();
  if (keepAliveThread_.joinable()) keepAliveThread_.join();
  if (executorThread_.joinable()) executorThread_.join();
  spdlog::trace("etcd session {}: its threads ended", ownId_);
  if (lost() || options_.readOnly) return;  // etcd ends it (or did); a read-only session has none
  try {
    EtcdClientOptions quick = clientOptions();
    quick.attemptTimeout = std::min<milliseconds>(quick.attemptTimeout, milliseconds(500));
    EtcdClient revoker(quick);
    revoker.leaseRevoke(lease_, Deadline(milliseconds(1000)));
  } catch (const std::exception& e) {
    spdlog::debug("etcd session {}: revoking the lease: {} (it ends by its TTL)", ownId_, e.what());
  }
}

EtcdClientOptions EtcdSession::clientOptions() const {
  EtcdClientOptions client = options_.client;
  client.silentPeerTimeout = ttl_;
  client.keyLease = jobLease_;
  client.keyLeasePrefix = kvPrefix_;
  return client;
}

std::string EtcdSession::lostReason() const {
  std::lock_guard lock(mutex_);
  return lostReason_;
}

void EtcdSession::attach(EtcdClient* client) {
  std::lock_guard lock(mutex_);
  attached_.insert(client);
  if (lost_) client->interrupt();
}

void EtcdSession::detach(EtcdClient* client) {
  std::lock_guard lock(mutex_);
  attached_.erase(client);
}

void EtcdSession::markLost(const std::string& why) {
  std::lock_guard lock(mutex_);
  if (lost_) return;
  lostReason_ = why;
  lost_ = true;
  for (EtcdClient* client : attached_) client->interrupt("this agent lost its etcd lease: " + why);
  watchClient_->interrupt();
  applyClient_->interrupt();
  changed_.notify_all();
}

bool EtcdSession::waitStopping(Clock::time_point until) {
  std::unique_lock lock(mutex_);
  changed_.wait_until(lock, until, [&] { return stopping_; });
  return stopping_;
}

void EtcdSession::stopKeepAliveForTest() {
  {
    std::lock_guard lock(mutex_);
    keepAlivePaused_ = true;
  }
  changed_.notify_all();
  keepAliveClient_->interrupt();
}

void EtcdSession::endLeaseForTest() {
  markLost("test: the agent died (lease revoked)");
  EtcdClient revoker(clientOptions());
  revoker.leaseRevoke(lease_, Deadline(options_.client.callTimeout));
}

Clock::time_point keepAliveRetryAt(Clock::time_point now, Clock::time_point lostAt, int failures,
                                   milliseconds ttl, double random01) {
  const milliseconds cap = std::max<milliseconds>(ttl / 4, milliseconds(200));
  milliseconds step(200);
  for (int i = 1; i < failures && step < cap; ++i) step *= 2;
  step = std::min(step, cap);
  const auto jitter = std::chrono::duration_cast<milliseconds>(step / 2 * std::clamp(random01, 0.0, 1.0));
  const Clock::time_point lastChance = lostAt - ttl / 8;
  if (now < lastChance) return std::min(now + step / 2 + jitter, lastChance);
  return std::max(now, lostAt);
}

bool EtcdSession::renewJobLease() {
  try {
    const Deadline deadline(std::max<milliseconds>(ttl_ / 3, milliseconds(500)));
    if (keepAliveClient_->leaseKeepAlive(jobLease_, deadline) > 0) return true;
    // Ended: no agent renewed it for its TTL (etcd removed the keys bound to it). Granted again,
    // so that this job's writes from here have a lease to be bound to.
    keepAliveClient_->leaseGrantWithId(jobLease_, jobTtl_);
    return true;
  } catch (const std::exception& e) {
    spdlog::debug("etcd session {}: renewing the job lease: {} (tried again at the next keep-alive)",
                  ownId_, e.what());
    return false;
  }
}

void EtcdSession::keepAlive() {
  const milliseconds interval = std::max<milliseconds>(ttl_ / 3, milliseconds(100));
  const milliseconds jobInterval = std::max<milliseconds>(jobTtl_ / 3, interval);
  Clock::time_point jobNext = grantedAt_ + jobInterval;
  const milliseconds lostAfter = ttl_ * 3 / 4;
  Clock::time_point renewed = grantedAt_;
  Clock::time_point next = grantedAt_ + interval;
  std::string lastError = "no answer";
  int failures = 0;  // in a row, since the last renewal
  std::minstd_rand random(static_cast<std::minstd_rand::result_type>(lease_ ^ Clock::now().time_since_epoch().count()));
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (;;) {
    if (waitStopping(next)) return;
    const Clock::time_point sentAt = Clock::now();
    const Clock::time_point lostAt = renewed + lostAfter;
    bool paused;
    {
      std::lock_guard lock(mutex_);
      paused = keepAlivePaused_;
    }
    if (paused) {
      lastError = "keep-alive stopped (a test's cut-off agent)";
    } else {
      try {
        const int64_t left = keepAliveClient_->leaseKeepAlive(
            lease_, Deadline::at(std::max(std::min(lostAt, sentAt + interval), sentAt + milliseconds(50))));
        if (left <= 0) {
          markLost("etcd says the lease " + ownId_ + " ended (this agent was silent too long)");
          return;
        }
        renewed = sentAt;
        failures = 0;
        next = sentAt + interval;
        if (jobLease_ != 0 && Clock::now() >= jobNext)
          jobNext = Clock::now() + (renewJobLease() ? jobInterval : interval);
        continue;
      } catch (const std::exception& e) {
        lastError = e.what();
      }
    }
    if (Clock::now() >= lostAt) {
      markLost("no etcd member renewed the lease for " +
               std::to_string(std::chrono::duration_cast<milliseconds>(Clock::now() - renewed).count()) +
               "ms (TTL " + std::to_string(ttl_.count()) + "ms): " + lastError);
      return;
    }
    next = keepAliveRetryAt(Clock::now(), lostAt, ++failures, ttl_, uniform(random));
  }
}

void EtcdSession::checkWritable() const {
  if (options_.readOnly) throw InvalidArgument("etcd store: opened read-only (no lease): it writes nothing");
}

void EtcdSession::setWill(EtcdClient& client, const Store::Will& will) {
  checkWritable();
  if (lost()) throw NetworkError("etcd: this agent lost its lease: " + lostReason());
  client.txn({}, willWrites(will), {}, true);
  willStored(will);
}

std::vector<EtcdOp> EtcdSession::willWrites(const Store::Will& will) const {
  checkWritable();
  if (etcd_keys::isEmptyWill(will)) return {EtcdOp::erase(willKey(ownId_))};
  // Keys as etcd holds them.
  Store::Will full;
  for (const auto& [key, value] : will.sets) full.sets.emplace_back(kvPrefix_ + key, value);
  for (const auto& [key, delta] : will.adds) full.adds.emplace_back(kvPrefix_ + key, delta);
  for (const auto& key : will.deletes) full.deletes.push_back(kvPrefix_ + key);
  return {EtcdOp::put(willKey(ownId_), encodeWill(full), jobLease_), EtcdOp::put(liveKey(ownId_), "", lease_)};
}

void EtcdSession::willStored(const Store::Will& will) {
  if (etcd_keys::isEmptyWill(will)) return;
  std::lock_guard lock(mutex_);
  if (!executorStarted_ && !stopping_) {
    executorStarted_ = true;
    executorThread_ = spawnThreadWithSignalsBlocked([this] { executeWills(); });
  }
}

void EtcdSession::runOwnWill(EtcdClient& client) {
  if (lost()) return;  // the others apply it when etcd ends the lease
  applyWillRecord(client, willKey(ownId_), liveKey(ownId_), kvPrefix_);
}

void EtcdSession::endLost(milliseconds timeout) {
  // The session's own clients were interrupted when it was lost: a client of this call's own.
  EtcdClientOptions bounded = clientOptions();
  bounded.callTimeout = std::min(bounded.callTimeout, timeout);
  EtcdClient client(bounded);
  client.leaseRevoke(lease_, Deadline(bounded.callTimeout));
  if (applyWillRecord(client, willKey(ownId_), liveKey(ownId_), kvPrefix_))
    spdlog::debug("etcd session {}: applied its own will before a new session", ownId_);
}

void EtcdSession::executeWills() {
  auto stopped = [&] {
    std::lock_guard lock(mutex_);
    return stopping_ || lost_;
  };
  const std::string liveEnd = EtcdClient::prefixEnd(liveDir_);
  while (!stopped()) {
    try {
      // Records whose lease ended while nobody watched, then every lease that ends from here.
      // Names only (N sessions each reading N records would be N^2 record bytes), and of the
      // live keys only their deletions (each session's put would reach N watchers).
      const EtcdRange wills = watchClient_->range(willDir_, EtcdClient::prefixEnd(willDir_), false, true);
      const EtcdRange lives = watchClient_->range(liveDir_, liveEnd, false, true);
      std::set<std::string> alive;
      for (const EtcdKeyValue& kv : lives.kvs) alive.insert(kv.key.substr(liveDir_.size()));
      for (const EtcdKeyValue& kv : wills.kvs) {
        const std::string id = kv.key.substr(willDir_.size());
        if (id != ownId_ && !alive.count(id) &&
            applyWillRecord(*applyClient_, kv.key, liveKey(id), kvPrefix_))
          spdlog::debug("etcd session {}: applied the will of ended lease {}", ownId_, id);
      }
      watchClient_->watch(liveDir_, liveEnd, wills.revision + 1, Deadline(std::chrono::seconds(30)),
                          [&](const std::vector<EtcdWatchEvent>& events) {
                            for (const EtcdWatchEvent& event : events) {
                              if (!event.deleted) continue;
                              const std::string id = event.kv.key.substr(liveDir_.size());
                              if (id != ownId_ &&
                                  applyWillRecord(*applyClient_, willKey(id), liveKey(id), kvPrefix_))
                                spdlog::debug("etcd session {}: applied the will of lease {}", ownId_, id);
                            }
                            return !stopped();
                          },
                          true);
    } catch (const TimeoutError&) {
      continue;  // a fresh look now and then
    } catch (const std::exception& e) {
      if (stopped()) return;
      spdlog::debug("etcd session {}: will executor: {}", ownId_, e.what());
      std::unique_lock lock(mutex_);
      changed_.wait_for(lock, milliseconds(200), [&] { return stopping_ || lost_.load(); });
    }
  }
}

}  // namespace drun::rdzv

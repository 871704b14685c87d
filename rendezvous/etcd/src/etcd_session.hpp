// EtcdSession: one etcd lease and what hangs on it (etcd_store.hpp has the design): the
// keep-alive thread (at a third of the TTL; a failed one retried with backoff, keepAliveRetryAt;
// lost after 3/4 of it without an answer), the will
// of the store that set one, and the will executor, which applies the wills of other sessions
// of the scope whose lease ended.
//
// Threading: thread-safe. The keep-alive and executor threads are the session's own, each with
// its own EtcdClient; the destructor interrupts and joins them, then revokes the lease (unless
// it was lost), bounded by a second.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "drun/etcd/etcd_client.hpp"
#include "drun/etcd/etcd_store.hpp"
#include "drun/store/store.hpp"

namespace drun::rdzv {

// Will records: one line per entry ("s KEY VALUE", "a KEY DELTA", "d KEY"; keys and values in
// base64, keys the full etcd keys). decodeWill returns nullopt for a malformed record.
std::string encodeWill(const Store::Will& will);
std::optional<Store::Will> decodeWill(const std::string& record);
// Applies the will stored at `willKey` once, in one transaction that also deletes the record and
// `liveKey`: the sets, then the adds (a key holding no integer is skipped, as StoreCore does;
// a +-1 is a put of the key's counter, etcd_keyspace.hpp), then the deletes; entries outside
// `kvPrefix` are ignored. Returns false when the record is gone
// (another session applied it). Throws on store errors.
bool applyWillRecord(EtcdClient& client, const std::string& willKey, const std::string& liveKey,
                     const std::string& kvPrefix);

// When a keep-alive that failed `failures` times in a row (1 = the first) is tried again:
// exponential backoff from 200 ms, doubling, capped at a quarter of the TTL, with jitter (a
// uniform draw `random01` in [0, 1) picks a point in the step's upper half, so that agents
// that failed together do not retry together). Never past the last chance, an eighth of the
// TTL before `lostAt` (the session's own bound, 3/4 of the TTL after the last renewal; etcd
// keeps the lease to the full TTL): a retry then still renews the lease. Once past the last
// chance, one last try at `lostAt`.
Clock::time_point keepAliveRetryAt(Clock::time_point now, Clock::time_point lostAt, int failures,
                                   milliseconds ttl, double random01);

class EtcdSession {
 public:
  explicit EtcdSession(const EtcdStoreOptions& options);
  ~EtcdSession();
  EtcdSession(const EtcdSession&) = delete;
  EtcdSession& operator=(const EtcdSession&) = delete;

  const EtcdStoreOptions& options() const { return options_; }
  // The client options for this session's connections: the store's, with a member silent for
  // the lease's TTL taken for dead (etcd_http.hpp: keepAliveProbesFor), so that a watch on a
  // member cut off is given up within the time the lease allows.
  EtcdClientOptions clientOptions() const;
  const std::string& kvPrefix() const { return kvPrefix_; }
  int64_t lease() const { return lease_; }
  // The job lease (EtcdStoreOptions::jobLeaseTtl; 0: none), kept alive beside the session's own.
  int64_t jobLease() const { return jobLease_; }
  milliseconds ttl() const { return ttl_; }
  bool lost() const { return lost_.load(); }
  // A key never handed out before in this cluster, under applied/ (an add's retry token).
  std::string nextAppliedKey() {
    checkWritable();
    return appliedDir_ + std::to_string(appliedCount_++);
  }
  // InvalidArgument when the session was opened read-only (EtcdStoreOptions::readOnly).
  void checkWritable() const;
  std::string lostReason() const;

  // A store's client is interrupted when the lease is lost (its blocked call ends at once).
  void attach(EtcdClient* client);
  void detach(EtcdClient* client);

  // Stores (or, for an empty will, deletes) this session's will record and the lease-bound
  // live key; starts the will executor.
  void setWill(EtcdClient& client, const Store::Will& will);
  // The same in two steps, for a transaction of the caller's: the writes (keys as the Store
  // names them), then willStored() once etcd applied them.
  std::vector<EtcdOp> willWrites(const Store::Will& will) const;
  void willStored(const Store::Will& will);
  // A clean close: applies this session's will now, and forgets it.
  void runOwnWill(EtcdClient& client);
  // A lost session's end before its agent goes on with a new one: the lease revoked, the will
  // applied (replaceLostEtcdSession), each call within `timeout`. Throws on store errors.
  void endLost(milliseconds timeout);
  void stopKeepAliveForTest();
  void endLeaseForTest();

 private:
  std::string willKey(const std::string& id) const { return willDir_ + id; }
  std::string liveKey(const std::string& id) const { return liveDir_ + id; }
  void keepAlive();
  // Renews the job lease (granted afresh, under the same id, when it ended). False when no
  // member answered (tried again at the next keep-alive). Never throws.
  bool renewJobLease();
  void executeWills();
  void markLost(const std::string& why);
  bool waitStopping(Clock::time_point until);

  EtcdStoreOptions options_;
  std::string kvPrefix_, willDir_, liveDir_, appliedDir_, ownId_;
  std::atomic<uint64_t> appliedCount_{0};
  int64_t lease_ = 0;
  milliseconds ttl_{0};
  int64_t jobLease_ = 0;
  std::chrono::seconds jobTtl_{0};
  Clock::time_point grantedAt_;
  std::unique_ptr<EtcdClient> keepAliveClient_, watchClient_, applyClient_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  bool keepAlivePaused_ = false;
  bool executorStarted_ = false;
  std::atomic<bool> lost_{false};
  std::string lostReason_;
  std::set<EtcdClient*> attached_;
  std::thread keepAliveThread_, executorThread_;
};

}  // namespace drun::rdzv

// EtcdStore: the LivenessStore over etcd v3 (EtcdClient), so that the c10d rendezvous (its round
// logic, planner and ledger unchanged) runs on a replicated store with no single point of failure.
//
// Keys live under options.prefix + "kv/"; a Store key K is the family of etcd keys in
// [K, K+"\x01") (etcd_keyspace.hpp): K as set, a counter per sign for adds of +-1, one key per
// append. Mapping of the Store contract:
//   set, multiSet                     txn: put K, delete the rest of its family
//   add +-1, append                   txn: put of the counter + range of the family; put
//                                     (never refused: N agents adding to one key do not race)
//   add of another delta, compareSet  range + txn on the revisions read, retried on a lost race
// An add also creates a token key of its own (applied/<lease>/<n>, bound to the lease; the
// next add removes it) only if it is absent: an add whose reply was lost (a member killed
// between applying and answering) is retried on another member and, finding its token, counts
// nothing more and answers the total at the token's revision (what the lost reply held).
//   deleteKey, deletePrefix, numKeys  deleterange of families; range (Store keys counted)
//   get, wait, multiGet, watch        range of the family, then a watch of it from the next revision
// compareSet, deleteKey and deletePrefix write under a token of their own too: a retry after
// an applied attempt answers what that attempt did (compareSet: its win, though another writer
// changed the value since; deleteKey: whether the key existed then), never the state after it.
// runBatch (store_batch.hpp): the whole batch in one transaction (one raft commit) when its
// operations touch distinct keys and can be written without a read first (set, tryGet, add of
// +-1, compareSet, append, setWill, deleteKey, deletePrefix; each add and compareSet a nested
// transaction with its own condition); another shape: one by one, as the default.
// Liveness: an EtcdSession holds one etcd lease (TTL = leaseTtl), kept alive at a third of its
// TTL by a thread of its own. A will is stored as a record (will/<scope>/<lease>) beside a key
// bound to the lease (live/<scope>/<lease>): when the lease ends (the agent died or was cut off
// from the majority), etcd deletes that key, and every other session of the scope that holds a
// will sees it in a watch and applies the record in one transaction (the record's deletion in
// the same transaction: exactly once). A store closed cleanly applies its own will, as a
// StoreServer does for a closed connection. Records whose lease ended while nobody watched are
// applied by the next session of the scope that sets a will.
// A session that cannot renew its lease for 3/4 of the TTL takes it for lost: every store on it
// fails (NetworkError "lost its etcd lease") and blocked calls end at once, so the agent fences
// its workers before the others re-form without it. A new session (a new lease) is a new client,
// opened only once the lost one's will has run (replaceLostEtcdSession).
//
// Threading: stores are thread-safe (calls run one at a time per store); the session's threads
// are its own. Ownership: a store shares its session; the session revokes its lease when the last
// store and the last owner let go of it.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "drun/common/death_notice.hpp"
#include "drun/etcd/etcd_client.hpp"
#include "drun/store/store.hpp"
#include "drun/store/store_batch.hpp"

namespace drun::rdzv {

struct EtcdStoreOptions {
  EtcdClientOptions client;
  std::string prefix = "/drun/";   // every key of drun under it
  std::string scope = "default";   // the run id: wills are watched per scope
  milliseconds leaseTtl = 5s;      // etcd raises it to its minimum (about 2 s); rounded up to seconds
  milliseconds connectTimeout = 10s;  // granting the lease, over every endpoint
  // The job lease (0: none): every key this store writes under the prefix (and its will record)
  // is bound to one lease that every session of the scope names alike and keeps alive, so that
  // etcd removes a job's keys this long after its last agent died without leaving (an agent
  // that leaves cleanly last moves them to a lease of their own, expireEndedJob).
  milliseconds jobLeaseTtl = 0ms;
  // Reads only (drun status): no lease is granted and no keep-alive runs, and reads are served
  // by any member (EtcdClientOptions::readsFromAnyMember), so reading needs no quorum; every
  // write (set, add, append, a will, a batch...) is refused with InvalidArgument.
  bool readOnly = false;
};

class EtcdSession;

// Grants a lease and starts its keep-alive. Throws NetworkError (no member reachable; refused),
// TimeoutError, AuthError, ProtocolError.
std::shared_ptr<EtcdSession> openEtcdSession(const EtcdStoreOptions& options);
// The session that takes over from `lost`, a session of this agent that took its lease for lost:
// first `lost`'s lease is revoked (its lease-bound keys go now, not at the TTL) and its will is
// applied (once: another session's executor may be at it too), then a new session is opened.
// A TCP store runs a closed connection's will before it serves the node's next connection; over
// etcd the other sessions apply a will when they see the lease end, which under load came after
// the node had joined the same round again on its new session: the round closed with it, then
// counted it gone while it ran, and re-formed without waiting for another member (the
// interleavings over etcd, "n0's link is cut while the closer joins"). Throws as
// openEtcdSession does, also when `lost` could not be ended (the caller connects again later).
std::shared_ptr<EtcdSession> replaceLostEtcdSession(const EtcdStoreOptions& options, EtcdSession& lost);
// True once the session took its lease for lost.
bool etcdSessionLost(const EtcdSession& session);
// The lease's TTL as granted.
milliseconds etcdSessionTtl(const EtcdSession& session);
// The request that revokes `session`'s lease, for a job guard to send once this process died
// (death_notice.hpp): the others then see the agent gone at once, not at the end of its TTL.
// nullopt over TLS or with auth (the watchdog speaks plain HTTP and holds no token) or when no
// member's name resolves (within a second).
std::optional<DeathNotice> etcdLeaseRevokeNotice(const EtcdSession& session);
// Tests: stop renewing the lease (the process is "cut off"; the lease ends after its TTL).
void stopKeepAliveForTest(EtcdSession& session);
// Tests: the agent dies now: the session is lost (its stores fail, blocked calls end) and its
// lease is revoked, so the other sessions' executors apply its will at once rather than after
// the TTL. Throws as a lease revoke does.
void endLeaseForTest(EtcdSession& session);

class EtcdStore final : public LivenessStore {
 public:
  explicit EtcdStore(std::shared_ptr<EtcdSession> session);
  ~EtcdStore() override;  // applies this store's will (unless the lease is lost)
  EtcdStore(const EtcdStore&) = delete;
  EtcdStore& operator=(const EtcdStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, milliseconds timeout) override;
  std::optional<Bytes> tryGet(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys, milliseconds timeout) override;
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  void append(const std::string& key, const Bytes& value) override;

  std::optional<Bytes> watch(const std::string& key, const std::optional<Bytes>& known,
                             milliseconds timeout) override;
  void setWill(const Will& will) override;
  int64_t deletePrefix(const std::string& prefix) override;
  void interrupt() override;
  void runBatch(StoreBatch& batch) override;
  // Every key under `prefix` rewritten as its value alone on a new lease of TTL `keep` (whole
  // seconds, at least 1), which nobody renews: etcd removes them when it ends. Families written
  // since the read are left as they are (a new start of the job). Throws as a write does.
  void expireEndedJob(const std::string& prefix, milliseconds keep) override;

  EtcdSession& session() { return *session_; }

 private:
  std::string k(const std::string& key) const;
  void checkLease() const;
  template <class Done>
  std::optional<Bytes> awaitValue(const std::string& full, const Deadline& deadline, Done done);
  // A write's retry token (applied/<lease>/<n>) and the tokens of writes that answered, which
  // its transaction removes (at most 32: the transaction stays under etcd's op limit).
  struct RetryToken {
    std::string key;
    std::vector<std::string> stale;
  };
  RetryToken newToken();
  void tokenAnswered(const RetryToken& token);
  // The transaction, applied only while the token is absent and creating it (bound to the
  // lease): the client may repeat it on another member after an unknown outcome. appliedAt > 0:
  // an earlier attempt was applied (its reply lost), at that etcd revision; the failure branch's
  // last range is the token's. etcd's answer that the lease is gone (EtcdError::leaseNotFound):
  // NetworkError.
  struct Guarded {
    EtcdTxnResult txn;
    int64_t appliedAt = 0;
  };
  Guarded guardedTxn(const RetryToken& token, std::vector<EtcdCompare> compares, std::vector<EtcdOp> success,
                     std::vector<EtcdOp> failure);
  // [key, end) as it was at `revision` (an applied attempt's); NetworkError when compacted.
  std::vector<EtcdKeyValue> readAt(const std::string& key, const std::string& end, int64_t revision,
                                   const std::string& what);
  int64_t addOnce(const std::string& key, const std::string& full, int64_t delta, const RetryToken& token);
  // runBatch's single transaction; false (nothing written) when the batch does not fit one.
  bool runBatchAsOneTxn(StoreBatch& batch);

  // The family a wait that timed out had followed, and the revision it knew it at: the next
  // wait for the same key resumes there (awaitValue). Families of up to kLookFamilyLimit keys.
  struct LastLook {
    std::string key;
    int64_t revision = 0;
    std::map<std::string, EtcdKeyValue> family;
  };
  static constexpr size_t kLookFamilyLimit = 64;

  std::shared_ptr<EtcdSession> session_;
  std::unique_ptr<EtcdClient> client_;
  std::mutex lookMutex_;
  std::optional<LastLook> lastLook_;
  bool ownsWill_ = false;
  std::mutex tokensMutex_;
  std::vector<std::string> finishedTokens_;  // tokens of adds that answered: the next add removes them
};

}  // namespace drun::rdzv

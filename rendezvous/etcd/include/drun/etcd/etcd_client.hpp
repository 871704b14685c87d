// EtcdClient: a small etcd v3 client over the gRPC-JSON gateway (HTTP/1.1 + JSON, Boost.Beast):
// the key-value calls, transactions, leases and watches that EtcdStore (etcd_store.hpp) builds
// the rendezvous store from. No Debian package offers a C++ etcd client; the gateway is part of
// every etcd server (checked against etcd 3.4.23).
//
// Endpoints: several members ("h1:2379,h2:2379,h3:2379"); a client starts on a random one; a
// call goes to the member that answered last and fails over to the next on a network error, a timeout of one attempt
// (attemptTimeout) or an "unavailable" answer (no leader, a member shutting down), within the
// call's deadline. A write whose outcome is unknown (sent, then the link broke) is retried only
// when the caller says it is idempotent; else NetworkError/TimeoutError.
// Auth: with a user, the client authenticates (/v3/auth/authenticate) and sends the token; an
// expired token is renewed once per call. TLS: with a CA file, https with the member's
// certificate checked against it.
// Errors: TimeoutError (the deadline passed), NetworkError (no member reachable), ProtocolError
// (a reply that is not the gateway's JSON: untrusted input never crashes), AuthError (refused
// credentials, a member certificate the CA does not verify), EtcdError (etcd refused the
// request: its message and gRPC code).
//
// Threading: thread-safe; calls run one at a time per client (hold one client per thread that
// blocks: a watch holds the client for its whole length). interrupt() from any thread ends the
// call in progress and every later one (NetworkError).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "drun/common/deadline.hpp"
#include "drun/common/error.hpp"

namespace drun::rdzv {

using namespace std::chrono_literals;

// etcd refused a request: its message and gRPC status code, which callers classify it by.
class EtcdError : public Error {
 public:
  static constexpr int64_t kNotFound = 5;  // gRPC NOT_FOUND
  EtcdError(const std::string& what, int64_t code) : Error(what), code_(code) {}
  int64_t code() const { return code_; }
  // The lease named in the request is gone (expired or revoked): for the calls this client makes
  // (KV, txn, lease, watch, auth) etcd answers NOT_FOUND for nothing else.
  bool leaseNotFound() const { return code_ == kNotFound; }

 private:
  int64_t code_;
};

struct EtcdClientOptions {
  std::vector<std::string> endpoints;  // "host:port" (port default 2379); at least one
  milliseconds callTimeout = 10s;      // deadline of a call that takes none
  milliseconds attemptTimeout = 2s;    // one member silent this long: try the next
  std::string user;                    // "" = no auth
  std::string password;
  std::string caFile;                  // "" = plain http; else https verified against it
  // A member that answers nothing, TCP keep-alive probes included, for this long is taken for
  // dead (its connection fails: the call or watch fails over). EtcdSession sets its lease TTL.
  milliseconds silentPeerTimeout = 3s;
  // Reads served by whichever member is asked, from what it holds (etcd's serializable range),
  // with no leader required: they work while the cluster has no quorum, and may be a moment
  // behind it. For reading only (drun status); writes still need a quorum.
  bool readsFromAnyMember = false;
  // A call tries each member once and then fails, with no pause and no second pass: for a
  // caller that paces its own retries (the lease keep-alive backs off between them).
  bool singlePass = false;
  // A put with no lease of its own whose key starts with keyLeasePrefix is bound to keyLease
  // (0: none): EtcdSession's job lease, so that the keys of a job with no live agent end.
  int64_t keyLease = 0;
  std::string keyLeasePrefix;
};
// Parses "h1:2379,h2,[::1]:2379" into endpoints. Throws InvalidArgument.
std::vector<std::string> parseEtcdEndpoints(const std::string& list);

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t createRevision = 0;
  int64_t modRevision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct EtcdRange {
  int64_t revision = 0;  // the store's revision the read saw
  std::vector<EtcdKeyValue> kvs;
  int64_t count = 0;
};

// One comparison of a transaction: target of `key` (its value, or a revision/version number)
// equal to (or less than) the given one. create revision 0 = the key is absent. With rangeEnd:
// every key in [key, rangeEnd) must compare so (true when there is none, except for Value).
struct EtcdCompare {
  enum class Target { Value, CreateRevision, ModRevision, Version };
  enum class Result { Equal, Less };
  EtcdCompare() = default;
  EtcdCompare(std::string key, Target target, std::string value, int64_t number, std::string rangeEnd = {},
              Result result = Result::Equal)
      : key(std::move(key)), target(target), value(std::move(value)), number(number),
        rangeEnd(std::move(rangeEnd)), result(result) {}
  std::string key;
  Target target = Target::Value;
  std::string value;
  int64_t number = 0;
  std::string rangeEnd;
  Result result = Result::Equal;
};

struct EtcdOp;
// A transaction inside a transaction (etcd 3.3 and later): its compares are evaluated with the
// outer ones, on the store as it was before the outer transaction; its branch's ops run in place.
struct EtcdNestedTxn {
  std::vector<EtcdCompare> compares;
  std::vector<EtcdOp> success, failure;
};

struct EtcdOp {
  enum class Kind { Put, Range, DeleteRange, Txn };
  Kind kind = Kind::Put;
  std::string key;
  std::string rangeEnd;  // Range/DeleteRange: "" = the key alone
  std::string value;     // Put
  int64_t lease = 0;     // Put: 0 = none
  std::shared_ptr<const EtcdNestedTxn> nested;  // Txn
  static EtcdOp put(std::string key, std::string value, int64_t lease = 0) {
    return {Kind::Put, std::move(key), {}, std::move(value), lease, {}};
  }
  static EtcdOp range(std::string key, std::string rangeEnd = {}) {
    return {Kind::Range, std::move(key), std::move(rangeEnd), {}, 0, {}};
  }
  static EtcdOp erase(std::string key, std::string rangeEnd = {}) {
    return {Kind::DeleteRange, std::move(key), std::move(rangeEnd), {}, 0, {}};
  }
  static EtcdOp txn(EtcdNestedTxn nested) {
    return {Kind::Txn, {}, {}, {}, 0, std::make_shared<const EtcdNestedTxn>(std::move(nested))};
  }
};

// etcd refuses a transaction of more operations than its --max-txn-ops (128 by default).
inline constexpr size_t kEtcdMaxOpsPerTxn = 128;

struct EtcdTxnResult {
  bool succeeded = false;
  int64_t revision = 0;
  std::vector<EtcdRange> ranges;  // one per Range op of the branch taken, in order
  int64_t deleted = 0;            // keys removed by the branch's DeleteRange ops
  std::vector<int64_t> deletedBy;  // the same, one per DeleteRange op, in order
  std::vector<EtcdTxnResult> nested;  // one per Txn op of the branch taken, in order
};

struct EtcdWatchEvent {
  bool deleted = false;  // else a put
  EtcdKeyValue kv;
};

namespace etcd {
class EtcdConnection;
}

class EtcdClient {
 public:
  explicit EtcdClient(EtcdClientOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  int64_t put(const std::string& key, const std::string& value, int64_t lease = 0);
  // countOnly: only `count`; keysOnly: the key-values without their values; revision > 0: as
  // the keys were at that revision (Error "compacted" when etcd no longer holds it).
  EtcdRange range(const std::string& key, const std::string& rangeEnd = {}, bool countOnly = false,
                  bool keysOnly = false, int64_t revision = 0);
  int64_t deleteRange(const std::string& key, const std::string& rangeEnd = {});
  EtcdTxnResult txn(const std::vector<EtcdCompare>& compares, const std::vector<EtcdOp>& success,
                    const std::vector<EtcdOp>& failure, bool idempotent);

  // Returns the lease id; `grantedTtl` gets the TTL etcd granted (it raises too short ones).
  int64_t leaseGrant(std::chrono::seconds ttl, std::chrono::seconds* grantedTtl = nullptr);
  // A lease of the caller's choosing (`id` > 0), as every agent of a job names the same one:
  // true when granted now, false when it exists already (etcd: "lease already exists").
  bool leaseGrantWithId(int64_t id, std::chrono::seconds ttl);
  // One keep-alive; returns the TTL left (0: the lease is gone).
  int64_t leaseKeepAlive(int64_t lease, const Deadline& deadline);
  void leaseRevoke(int64_t lease, const Deadline& deadline);
  int64_t leaseTimeToLive(int64_t lease);  // -1: gone

  // Watches [key, rangeEnd) from startRevision (0: now); hands each batch of events to onEvents
  // until it returns false. A member that fails meanwhile: resumes on another from the next
  // revision. TimeoutError at the deadline; NetworkError when no member answers. deletesOnly:
  // etcd leaves the puts out (its NOPUT filter; they are not sent at all).
  void watch(const std::string& key, const std::string& rangeEnd, int64_t startRevision,
             const Deadline& deadline,
             const std::function<bool(const std::vector<EtcdWatchEvent>&)>& onEvents,
             bool deletesOnly = false);
  // watch() from startRevision, opened as a watch "from now" while the store is still at
  // startRevision - 1: etcd serves that one at once, where a watch from a past revision waits
  // for etcd's catch-up loop (up to 100 ms). Returns false, with no event handed over, when the
  // store had moved on by then (the caller reads again).
  bool watchFromNow(const std::string& key, const std::string& rangeEnd, int64_t startRevision,
                    const Deadline& deadline,
                    const std::function<bool(const std::vector<EtcdWatchEvent>&)>& onEvents);

  // Ends the call in progress and every later one (NetworkError "...: interrupted: <why>").
  void interrupt(const std::string& why = {});
  // The member the last call went to, for messages.
  std::string endpointName() const;
  // The end of the range of every key that starts with `prefix`.
  static std::string prefixEnd(const std::string& prefix);

 private:
  std::string call(const std::string& path, const std::string& body, const Deadline& deadline,
                   bool idempotent);
  bool watchStream(const std::string& key, const std::string& rangeEnd, int64_t startRevision,
                   const Deadline& deadline,
                   const std::function<bool(const std::vector<EtcdWatchEvent>&)>& onEvents,
                   bool deletesOnly, bool fromNow);
  void authenticate(etcd::EtcdConnection& connection, const Deadline& deadline);
  // Closes the kept connections whose member closed them (a member killed): none lingers in
  // CLOSE-WAIT until the client happens to use that member again. Under mutex_.
  void closeConnectionsPeersClosed();
  NetworkError interruptedError(const std::string& what) const;

  EtcdClientOptions options_;
  std::vector<std::unique_ptr<etcd::EtcdConnection>> connections_;
  mutable std::mutex mutex_;  // one call at a time; guards current_ and token_
  size_t current_ = 0;
  std::string token_;
  std::atomic<bool> interrupted_{false};
  mutable std::mutex reasonMutex_;  // guards interruptReason_ (set while a call holds mutex_)
  std::string interruptReason_;
};

}  // namespace drun::rdzv

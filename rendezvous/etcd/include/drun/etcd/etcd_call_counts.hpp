// Requests every EtcdClient of this process sent to etcd, by kind: what a rendezvous costs
// etcd per agent (etcd_rendezvous_bench reports them). A request is one HTTP exchange with a
// member: a call that failed over to another member counts once per member tried; a watch
// counts once per stream opened.
//
// Threading: thread-safe (relaxed atomic counters, process-wide).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace drun::rdzv {

struct EtcdCallCounts {
  uint64_t range = 0, put = 0, deleteRange = 0, txn = 0;
  uint64_t txnFailed = 0;  // transactions whose compares failed (a lost compare-and-swap race)
  uint64_t leaseGrant = 0, keepAlive = 0, leaseRevoke = 0, leaseTimeToLive = 0;
  uint64_t watch = 0, auth = 0;
  uint64_t requests() const {
    return range + put + deleteRange + txn + leaseGrant + keepAlive + leaseRevoke + leaseTimeToLive + watch + auth;
  }
  // "range=R put=P ..." (every field, txnFailed included), and back; parse gives zeros for
  // names it does not know.
  std::string format() const;
  static EtcdCallCounts parse(std::string_view text);
  EtcdCallCounts& operator+=(const EtcdCallCounts& other);
  EtcdCallCounts& operator-=(const EtcdCallCounts& other);
};

// Counts so far in this process.
EtcdCallCounts etcdCallCounts();
// Counts one request to `path` (the gateway's: "/v3/kv/range", ...); unknown paths are ignored.
void countEtcdRequest(std::string_view path);
void countEtcdTxnFailed();

}  // namespace drun::rdzv

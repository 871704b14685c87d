// EtcdStore::expireEndedJob: what an ended job leaves in etcd (its outcome and history, which
// `drun status` reads) is bound to a lease of its own, so that etcd removes it once that lease's
// TTL passed. Nobody keeps the lease alive: the TTL is how long an ended job stays readable.
#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"
#include "drun/etcd/etcd_store.hpp"
#include "etcd_keyspace.hpp"
#include "etcd_session.hpp"

namespace drun::rdzv {
namespace {

// The families of a range's key-values (in key order: a family's etcd keys are adjacent), each
// rewritten as its value alone, bound to `lease`: the put replaces K's lease, and its counters'
// and appends' keys go (their value is folded into K).
struct EndedFamilies {
  std::vector<EtcdOp> writes;
  std::vector<std::string> firstKeys;  // per family, to bound a transaction's compare
};

EndedFamilies rewriteOnLease(const std::vector<EtcdKeyValue>& kvs, int64_t lease) {
  EndedFamilies out;
  for (size_t at = 0; at < kvs.size();) {
    const std::string family = etcd_keys::familyOf(kvs[at].key);
    const std::string end = etcd_keys::familyEnd(family);
    std::vector<EtcdKeyValue> members;
    while (at < kvs.size() && kvs[at].key < end) members.push_back(kvs[at++]);
    const std::optional<std::string> value = etcd_keys::foldFamily(family, members);
    if (!value) continue;
    out.firstKeys.push_back(family);
    out.writes.push_back(EtcdOp::put(family, *value, lease));
    out.writes.push_back(EtcdOp::erase(etcd_keys::generatedStart(family), end));
  }
  return out;
}

}  // namespace

void EtcdStore::expireEndedJob(const std::string& prefix, milliseconds keep) {
  checkLease();
  session_->checkWritable();
  if (prefix.empty()) throw InvalidArgument("expireEndedJob: empty prefix");
  const std::string full = k(prefix);
  const EtcdRange now = client_->range(full, EtcdClient::prefixEnd(full));
  if (now.kvs.empty()) return;
  const auto seconds = std::max<int64_t>(1, (keep.count() + 999) / 1000);
  const int64_t lease = client_->leaseGrant(std::chrono::seconds(seconds));
  const EndedFamilies ended = rewriteOnLease(now.kvs, lease);
  // Transactions of whole families (two ops each), each only if nothing in its key range was
  // written since the read: a new start of the same job id meanwhile keeps its keys as they are.
  const size_t perTxn = kEtcdMaxOpsPerTxn / 2;
  for (size_t f = 0; f < ended.firstKeys.size(); f += perTxn) {
    const size_t last = std::min(ended.firstKeys.size(), f + perTxn);
    const std::vector<EtcdOp> chunk(ended.writes.begin() + 2 * f, ended.writes.begin() + 2 * last);
    const EtcdCompare untouched{ended.firstKeys[f], EtcdCompare::Target::ModRevision, {}, now.revision + 1,
                                etcd_keys::familyEnd(ended.firstKeys[last - 1]), EtcdCompare::Result::Less};
    if (!client_->txn({untouched}, chunk, {}, true).succeeded) {
      spdlog::debug("etcd store: [{}] written again after its job ended: its keys kept", prefix);
      return;
    }
  }
  spdlog::debug("etcd store: the {} key(s) left of [{}] end in {} s (lease {:x})", ended.firstKeys.size(),
                prefix, seconds, lease);
}

}  // namespace drun::rdzv

// EtcdStore::runBatch: a StoreBatch as one etcd transaction (etcd_store.hpp, store_batch.hpp).
// Each operation becomes the writes and reads its own call would make, without the read a call
// makes first: an add of +-1 is a nested transaction "K absent (a counter's K is never set) ->
// put the counter, read the family; else read the family", a compareSet one "the family is as
// expected (absent for "", else K equal and nothing generated) -> replace it; else read it", so
// that one operation's condition never holds the others back. The batch's retry token is the
// outer compare. Distinct keys only (etcd refuses a key written twice, or written inside a
// deleted range), so each operation's result is also what it would read alone at the
// transaction's revision: a retry after an applied attempt reads them back there. Left over,
// and then run by its own call after the others: an add on a K that holds an integer (it is
// rewritten), a compareSet that matches only by torch's rules (a K holding "" for "").
#include <algorithm>

#include "drun/common/error.hpp"
#include "drun/etcd/etcd_store.hpp"
#include "etcd_keyspace.hpp"
#include "etcd_session.hpp"

namespace drun::rdzv {
namespace {

using namespace etcd_keys;
using Kind = StoreBatch::Kind;

constexpr size_t kTokenOps = 1 + 32;   // the token's put, the stale tokens' erasures

bool hasNul(const std::string& key) { return key.find('\0') != std::string::npos; }

// A will naming a key etcd cannot hold: refused by setWill itself, one by one.
bool hasNul(const Store::Will& will) {
  return std::any_of(will.sets.begin(), will.sets.end(), [](const auto& e) { return hasNul(e.first); }) ||
         std::any_of(will.adds.begin(), will.adds.end(), [](const auto& e) { return hasNul(e.first); }) ||
         std::any_of(will.deletes.begin(), will.deletes.end(), [](const auto& key) { return hasNul(key); });
}

// What one operation became in the transaction.
struct Planned {
  std::string key, end;  // the etcd keys it touches: [key, end)
  std::string written;   // add, compareSet: the key its nested transaction writes
  int range = -1;        // its range among the branch's reads
  int erase = -1;        // its DeleteRange among the branch's deletes
  int nested = -1;       // its nested transaction among the branch's
};

}  // namespace

void EtcdStore::runBatch(StoreBatch& batch) {
  checkLease();
  batch.clearOutcomes();
  if (batch.empty() || runBatchAsOneTxn(batch)) {
    batch.rethrowFirstFailure();
    return;
  }
  LivenessStore::runBatch(batch);
}

bool EtcdStore::runBatchAsOneTxn(StoreBatch& batch) {
  std::vector<EtcdOp> writes;
  std::vector<Planned> plan(batch.size());
  // Where the op about to be added lands among the branch's reads / deletes (the replies' order).
  auto next = [&](EtcdOp::Kind kind) {
    return static_cast<int>(std::count_if(writes.begin(), writes.end(), [&](const EtcdOp& w) { return w.kind == kind; }));
  };
  const Store::Will* will = nullptr;
  for (size_t i = 0; i < batch.size(); ++i) {
    const StoreBatch::Op& op = batch.op(i);
    Planned& p = plan[i];
    if (op.kind == Kind::SetWill) {
      if (will || hasNul(op.will)) return false;  // one will per transaction
      will = &op.will;
      for (EtcdOp& w : session_->willWrites(op.will)) writes.push_back(std::move(w));
      continue;
    }
    if (hasNul(op.key)) return false;  // refused one by one
    p.key = k(op.key);
    p.end = op.kind == Kind::DeletePrefix ? EtcdClient::prefixEnd(p.key) : familyEnd(p.key);
    for (size_t j = 0; j < i; ++j)
      if (!plan[j].key.empty() && p.key < plan[j].end && plan[j].key < p.end) return false;
    switch (op.kind) {
      case Kind::Set:
        writes.push_back(EtcdOp::put(p.key, op.value));
        writes.push_back(EtcdOp::erase(generatedStart(p.key), p.end));
        break;
      case Kind::TryGet:
        p.range = next(EtcdOp::Kind::Range);
        writes.push_back(EtcdOp::range(p.key, p.end));
        break;
      case Kind::Add:
        if (op.delta != 1 && op.delta != -1) return false;  // needs K's value first
        p.written = op.delta == 1 ? incrementKey(p.key) : decrementKey(p.key);
        p.nested = next(EtcdOp::Kind::Txn);
        writes.push_back(EtcdOp::txn({{{p.key, EtcdCompare::Target::CreateRevision, {}, 0}},
                                      {EtcdOp::put(p.written, ""), EtcdOp::range(p.key, p.end)},
                                      {EtcdOp::range(p.key, p.end)}}));
        break;
      case Kind::CompareSet: {
        EtcdNestedTxn swap{{}, {EtcdOp::put(p.key, op.desired), EtcdOp::erase(generatedStart(p.key), p.end)},
                           {EtcdOp::range(p.key, p.end)}};
        if (op.value.empty()) {  // absent
          swap.compares.push_back({p.key, EtcdCompare::Target::CreateRevision, {}, 1, p.end, EtcdCompare::Result::Less});
        } else {
          swap.compares.push_back({p.key, EtcdCompare::Target::Value, op.value, 0});
          swap.compares.push_back({generatedStart(p.key), EtcdCompare::Target::CreateRevision, {}, 1, p.end,
                                   EtcdCompare::Result::Less});
        }
        p.written = p.key;
        p.nested = next(EtcdOp::Kind::Txn);
        writes.push_back(EtcdOp::txn(std::move(swap)));
        break;
      }
      case Kind::Append: writes.push_back(EtcdOp::put(appendKey(p.key, uniqueId()), op.value)); break;
      case Kind::DeleteKey:
        p.erase = next(EtcdOp::Kind::DeleteRange);
        writes.push_back(EtcdOp::erase(p.key, p.end));
        break;
      case Kind::DeletePrefix:
        p.range = next(EtcdOp::Kind::Range);
        writes.push_back(EtcdOp::range(p.key, p.end));
        writes.push_back(EtcdOp::erase(p.key, p.end));
        break;
      case Kind::SetWill: break;
    }
  }
  if (writes.size() + kTokenOps + 3 > kEtcdMaxOpsPerTxn) return false;  // (3: a nested txn's own ops)

  const RetryToken token = newToken();
  Guarded done;
  try {
    done = guardedTxn(token, {}, writes, {});
  } catch (const InvalidArgument&) {
    return false;  // etcd refused its shape (a lower --max-txn-ops): one by one
  } catch (const std::exception&) {
    // Unknown outcome, or a lost lease: the batch ends, as a lost connection ends TcpStore's.
    for (size_t i = 0; i < batch.size(); ++i) {
      batch.outcome(i).ran = true;
      batch.outcome(i).error = std::current_exception();
    }
    throw;
  }
  if (!done.txn.succeeded && !done.appliedAt) return false;  // (only the token is compared)
  tokenAnswered(token);
  if (will) {
    session_->willStored(*will);
    ownsWill_ = !isEmptyWill(*will);
  }

  // Each operation's result: from the transaction's reads, or (an attempt applied before, its
  // reply lost) read back at its revision, and just before it for what a delete removed.
  auto readBack = [&](const Planned& p, int64_t revision) {
    return done.txn.succeeded ? done.txn.ranges[p.range].kvs
                              : readAt(p.key, p.end, revision, "store batch on [" + p.key + "]");
  };
  // An add's or compareSet's nested transaction: whether it wrote, and its family after it.
  auto nestedOutcome = [&](const Planned& p) -> std::pair<bool, std::vector<EtcdKeyValue>> {
    if (done.txn.succeeded) {
      const EtcdTxnResult& inner = done.txn.nested[p.nested];
      return {inner.succeeded, inner.ranges.empty() ? std::vector<EtcdKeyValue>{} : inner.ranges.front().kvs};
    }
    std::vector<EtcdKeyValue> family = readBack(p, done.appliedAt);
    const bool wrote = std::any_of(family.begin(), family.end(), [&](const EtcdKeyValue& kv) {
      return kv.key == p.written && kv.modRevision == done.appliedAt;
    });
    return {wrote, std::move(family)};
  };
  std::vector<size_t> leftOver;
  for (size_t i = 0; i < batch.size(); ++i) {
    const StoreBatch::Op& op = batch.op(i);
    const Planned& p = plan[i];
    StoreBatch::Outcome& out = batch.outcome(i);
    out.ran = true;
    try {
      switch (op.kind) {
        case Kind::TryGet: out.value = foldFamily(p.key, readBack(p, done.appliedAt)); break;
        case Kind::Add: {
          const auto [added, family] = nestedOutcome(p);
          const std::optional<Bytes> value = foldFamily(p.key, family);
          const std::optional<int64_t> total = parseInteger(value.value_or(""));
          if (!total) throw InvalidArgument("add on [" + op.key + "]: the value is not an integer");
          if (added)
            out.number = *total;
          else
            leftOver.push_back(i);  // K holds an integer: rewritten by the add itself
          break;
        }
        case Kind::CompareSet: {
          const auto [swapped, family] = nestedOutcome(p);
          const std::optional<Bytes> value = foldFamily(p.key, family);
          if (swapped)
            out.value = op.desired;
          else if (value ? *value == op.value : op.value.empty())
            leftOver.push_back(i);  // equal by torch's rules only
          else
            out.value = value ? *value : op.value;
          break;
        }
        case Kind::DeleteKey:
          out.number = done.txn.succeeded ? (done.txn.deletedBy[p.erase] > 0 ? 1 : 0)
                                          : (readBack(p, done.appliedAt - 1).empty() ? 0 : 1);
          break;
        case Kind::DeletePrefix: out.number = familiesIn(readBack(p, done.appliedAt - 1)); break;
        case Kind::Set:
        case Kind::Append:
        case Kind::SetWill: break;
      }
    } catch (const NetworkError&) {
      out.error = std::current_exception();
      throw;
    } catch (const std::exception&) {
      out.error = std::current_exception();
    }
  }
  for (size_t i : leftOver) {
    const StoreBatch::Op& op = batch.op(i);
    StoreBatch::Outcome& out = batch.outcome(i);
    try {
      if (op.kind == Kind::Add)
        out.number = add(op.key, op.delta);
      else
        out.value = compareSet(op.key, op.value, op.desired);
    } catch (const NetworkError&) {
      out.error = std::current_exception();
      throw;
    } catch (const std::exception&) {
      out.error = std::current_exception();
    }
  }
  return true;
}

}  // namespace drun::rdzv

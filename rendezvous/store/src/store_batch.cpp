// StoreBatch and LivenessStore's sequential runBatch. See store_batch.hpp.
#include "drun/store/store_batch.hpp"

#include "drun/common/error.hpp"

namespace drun::rdzv {

size_t StoreBatch::push(Op op) {
  if (ops_.size() >= kMaxOps)
    throw InvalidArgument("a store batch holds at most " + std::to_string(kMaxOps) +
                          " operations");
  ops_.push_back(std::move(op));
  outcomes_.emplace_back();
  return ops_.size() - 1;
}

size_t StoreBatch::set(std::string key, Bytes value) {
  return push({.kind = Kind::Set, .key = std::move(key), .value = std::move(value)});
}

size_t StoreBatch::tryGet(std::string key) {
  return push({.kind = Kind::TryGet, .key = std::move(key)});
}

size_t StoreBatch::add(std::string key, int64_t delta) {
  return push({.kind = Kind::Add, .key = std::move(key), .delta = delta});
}

size_t StoreBatch::compareSet(std::string key, Bytes expected, Bytes desired) {
  return push({.kind = Kind::CompareSet,
               .key = std::move(key),
               .value = std::move(expected),
               .desired = std::move(desired)});
}

size_t StoreBatch::append(std::string key, Bytes value) {
  return push({.kind = Kind::Append, .key = std::move(key), .value = std::move(value)});
}

size_t StoreBatch::setWill(Store::Will will) {
  return push({.kind = Kind::SetWill, .will = std::move(will)});
}

size_t StoreBatch::deleteKey(std::string key) {
  return push({.kind = Kind::DeleteKey, .key = std::move(key)});
}

size_t StoreBatch::deletePrefix(std::string prefix) {
  if (prefix.empty()) throw InvalidArgument("deletePrefix: the prefix must not be empty");
  return push({.kind = Kind::DeletePrefix, .key = std::move(prefix)});
}

const StoreBatch::Outcome& StoreBatch::checked(size_t i) const {
  const Outcome& o = outcomes_.at(i);
  if (o.error) std::rethrow_exception(o.error);
  if (!o.ran) throw Error("store batch: operation " + std::to_string(i) + " did not run");
  return o;
}

bool StoreBatch::ok(size_t i) const {
  const Outcome& o = outcomes_.at(i);
  return o.ran && !o.error;
}

const std::optional<Bytes>& StoreBatch::value(size_t i) const { return checked(i).value; }

int64_t StoreBatch::number(size_t i) const { return checked(i).number; }

void StoreBatch::clearOutcomes() {
  for (Outcome& o : outcomes_) o = Outcome{};
}

void StoreBatch::rethrowFirstFailure() const {
  for (const Outcome& o : outcomes_)
    if (o.error) std::rethrow_exception(o.error);
}

void runBatchOp(LivenessStore& store, StoreBatch& batch, size_t i) {
  const StoreBatch::Op& op = batch.op(i);
  StoreBatch::Outcome& out = batch.outcome(i);
  try {
    switch (op.kind) {
      case StoreBatch::Kind::Set: store.set(op.key, op.value); break;
      case StoreBatch::Kind::TryGet: out.value = store.tryGet(op.key); break;
      case StoreBatch::Kind::Add: out.number = store.add(op.key, op.delta); break;
      case StoreBatch::Kind::CompareSet: out.value = store.compareSet(op.key, op.value, op.desired); break;
      case StoreBatch::Kind::Append: store.append(op.key, op.value); break;
      case StoreBatch::Kind::SetWill: store.setWill(op.will); break;
      case StoreBatch::Kind::DeleteKey: out.number = store.deleteKey(op.key) ? 1 : 0; break;
      case StoreBatch::Kind::DeletePrefix: out.number = store.deletePrefix(op.key); break;
    }
    out.ran = true;
  } catch (const NetworkError&) {
    out.ran = true;
    out.error = std::current_exception();
    throw;  // the connection is gone: the rest cannot run
  } catch (const std::exception&) {
    out.ran = true;
    out.error = std::current_exception();
  }
}

void LivenessStore::runBatch(StoreBatch& batch) {
  batch.clearOutcomes();
  for (size_t i = 0; i < batch.size(); ++i) runBatchOp(*this, batch, i);
  batch.rethrowFirstFailure();
}

}  // namespace drun::rdzv

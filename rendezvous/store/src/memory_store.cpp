#include "drun/store/memory_store.hpp"

#include <condition_variable>
#include <mutex>

#include "drun/common/deadline.hpp"
#include "drun/common/error.hpp"
#include "drun/store/store_batch.hpp"
#include "drun/store/store_core.hpp"

namespace drun::rdzv {

class MemoryStore::Shared {
 public:
  std::mutex mutex;
  std::condition_variable changed;  // notified by every waiter callback
  StoreCore core;
};

namespace {

std::string keyList(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i) out += ", ";
    out += keys[i];
  }
  return out + "]";
}

std::string describeTimeout(const char* what, milliseconds timeout,
                            const std::vector<std::string>& keys) {
  return std::string(what) + " timed out after " + std::to_string(timeout.count()) + "ms on " +
         keyList(keys) + " in the in-process store";
}

}  // namespace

// Blocks (lock held on return) until every key exists; the keys are present when it returns.
void MemoryStore::waitUntilPresent(Shared& shared, uint64_t client,
                                   const std::vector<std::string>& keys, Deadline deadline,
                                   milliseconds timeout, const char* what,
                                   std::unique_lock<std::mutex>& lock) {
  for (;;) {
    auto ready = std::make_shared<bool>(false);
    auto& cv = shared.changed;
    StoreCore::WaiterId id = shared.core.waitFor(client, keys, [ready, &cv] {
      *ready = true;
      cv.notify_all();
    });
    if (id == 0) return;
    if (!cv.wait_until(lock, deadline.when(), [&] { return *ready; })) {
      shared.core.cancel(id);
      throw TimeoutError(describeTimeout(what, timeout, shared.core.missing(keys)));
    }
    // The callback ran inside the write that created the last key, with this lock held by the
    // writer; another writer may have deleted a key since, so check again.
  }
}

std::shared_ptr<MemoryStore::Shared> MemoryStore::makeShared() {
  return std::make_shared<Shared>();
}

MemoryStore::MemoryStore(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {
  if (!shared_) throw InvalidArgument("MemoryStore: null shared state");
  std::lock_guard lock(shared_->mutex);
  clientId_ = shared_->core.newClient();
}

MemoryStore::~MemoryStore() {
  std::lock_guard lock(shared_->mutex);
  shared_->core.clientGone(clientId_);
  shared_->changed.notify_all();
}

std::unique_ptr<MemoryStore> MemoryStore::clone() const {
  return std::make_unique<MemoryStore>(shared_);
}

void MemoryStore::fireWillForTest() {
  std::lock_guard lock(shared_->mutex);
  shared_->core.clientGone(clientId_);
  shared_->changed.notify_all();
}

void MemoryStore::closeForTest() {
  std::lock_guard lock(shared_->mutex);
  closed_ = true;
  shared_->core.clientGone(clientId_);
  shared_->changed.notify_all();
}

std::unique_lock<std::mutex> MemoryStore::lockOpen() const {
  std::unique_lock lock(shared_->mutex);
  if (closed_) throw NetworkError("in-process store: this connection was closed");
  return lock;
}

void MemoryStore::set(const std::string& key, const Bytes& value) {
  auto lock = lockOpen();
  shared_->core.set(key, value);
}

Bytes MemoryStore::get(const std::string& key, milliseconds timeout) {
  return multiGet({key}, timeout).front();
}

std::optional<Bytes> MemoryStore::tryGet(const std::string& key) {
  auto lock = lockOpen();
  shared_->core.validateKey(key);
  return shared_->core.tryGet(key);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  auto lock = lockOpen();
  return shared_->core.add(key, delta);
}

Bytes MemoryStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  auto lock = lockOpen();
  return shared_->core.compareSet(key, expected, desired);
}

void MemoryStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  auto lock = lockOpen();
  waitUntilPresent(*shared_, clientId_, keys, Deadline(timeout), timeout, "wait", lock);
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  auto lock = lockOpen();
  shared_->core.validateKeyCount(keys.size());
  for (const auto& k : keys) shared_->core.validateKey(k);
  return shared_->core.check(keys);
}

bool MemoryStore::deleteKey(const std::string& key) {
  auto lock = lockOpen();
  shared_->core.validateKey(key);
  return shared_->core.erase(key);
}

int64_t MemoryStore::numKeys() {
  auto lock = lockOpen();
  return shared_->core.numKeys();
}

std::vector<Bytes> MemoryStore::multiGet(const std::vector<std::string>& keys,
                                         milliseconds timeout) {
  auto lock = lockOpen();
  waitUntilPresent(*shared_, clientId_, keys, Deadline(timeout), timeout,
                   keys.size() == 1 ? "get" : "multiGet", lock);
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& k : keys) values.push_back(*shared_->core.find(k));
  return values;
}

void MemoryStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  auto lock = lockOpen();
  shared_->core.multiSet(keys, values);
}

void MemoryStore::append(const std::string& key, const Bytes& value) {
  auto lock = lockOpen();
  shared_->core.append(key, value);
}

std::optional<Bytes> MemoryStore::watch(const std::string& key, const std::optional<Bytes>& known,
                                        milliseconds timeout) {
  Deadline deadline(timeout);
  auto lock = lockOpen();
  struct Outcome {
    bool fired = false;
    std::optional<Bytes> value;
  };
  auto outcome = std::make_shared<Outcome>();
  auto& cv = shared_->changed;
  StoreCore::WaiterId id =
      shared_->core.watch(clientId_, key, known, [outcome, &cv](const std::optional<Bytes>& v) {
        outcome->fired = true;
        outcome->value = v;
        cv.notify_all();
      });
  if (id == 0) return shared_->core.tryGet(key);
  if (!cv.wait_until(lock, deadline.when(), [&] { return outcome->fired; })) {
    shared_->core.cancel(id);
    throw TimeoutError(describeTimeout("watch", timeout, {key}));
  }
  return outcome->value;
}

void MemoryStore::setWill(const Will& will) {
  auto lock = lockOpen();
  shared_->core.setWill(clientId_, will);
}

int64_t MemoryStore::deletePrefix(const std::string& prefix) {
  auto lock = lockOpen();
  return shared_->core.erasePrefix(prefix);
}

// One step under the lock (memory_store.hpp): each operation as its call would do it.
void MemoryStore::runBatch(StoreBatch& batch) {
  batch.clearOutcomes();
  {
    auto lock = lockOpen();
    StoreCore& core = shared_->core;
    for (size_t i = 0; i < batch.size(); ++i) {
      const StoreBatch::Op& op = batch.op(i);
      StoreBatch::Outcome& out = batch.outcome(i);
      out.ran = true;
      try {
        switch (op.kind) {
          case StoreBatch::Kind::Set: core.set(op.key, op.value); break;
          case StoreBatch::Kind::TryGet:
            core.validateKey(op.key);
            out.value = core.tryGet(op.key);
            break;
          case StoreBatch::Kind::Add: out.number = core.add(op.key, op.delta); break;
          case StoreBatch::Kind::CompareSet: out.value = core.compareSet(op.key, op.value, op.desired); break;
          case StoreBatch::Kind::Append: core.append(op.key, op.value); break;
          case StoreBatch::Kind::SetWill: core.setWill(clientId_, op.will); break;
          case StoreBatch::Kind::DeleteKey:
            core.validateKey(op.key);
            out.number = core.erase(op.key) ? 1 : 0;
            break;
          case StoreBatch::Kind::DeletePrefix: out.number = core.erasePrefix(op.key); break;
        }
      } catch (const std::exception&) {
        out.error = std::current_exception();
      }
    }
  }
  batch.rethrowFirstFailure();
}

}  // namespace drun::rdzv

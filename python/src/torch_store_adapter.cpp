#include "torch_store_adapter.hpp"

#include <chrono>

namespace drun::torch_backend {

namespace {

std::vector<uint8_t> toVector(const rdzv::Bytes& b) { return {b.begin(), b.end()}; }
rdzv::Bytes toBytes(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

std::string listKeys(const std::vector<std::string>& keys) {
  std::string s = "[";
  for (size_t i = 0; i < keys.size(); ++i) s += (i ? ", " : "") + keys[i];
  return s + "]";
}

// Runs a c10d call, turning its exceptions into drun's (no c10::Error reaches libdrun_comm).
template <class F>
auto guarded(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const drun::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw NetworkError("torch store: " + what + " failed: " + e.what());
  }
}

}  // namespace

TorchStoreAdapter::TorchStoreAdapter(c10::intrusive_ptr<c10d::Store> store)
    : store_(std::move(store)) {
  if (!store_) throw InvalidArgument("torch store: null");
}

void TorchStoreAdapter::set(const std::string& key, const rdzv::Bytes& value) {
  guarded("set " + key, [&] { store_->set(key, toVector(value)); });
}

rdzv::Bytes TorchStoreAdapter::get(const std::string& key, milliseconds timeout) {
  wait({key}, timeout);
  return guarded("get " + key, [&] { return toBytes(store_->get(key)); });
}

std::optional<rdzv::Bytes> TorchStoreAdapter::tryGet(const std::string& key) {
  if (!check({key})) return std::nullopt;
  return guarded("get " + key, [&] { return toBytes(store_->get(key)); });
}

int64_t TorchStoreAdapter::add(const std::string& key, int64_t delta) {
  return guarded("add " + key, [&] { return store_->add(key, delta); });
}

rdzv::Bytes TorchStoreAdapter::compareSet(const std::string& key, const rdzv::Bytes& expected,
                                          const rdzv::Bytes& desired) {
  return guarded("compare_set " + key, [&] {
    return toBytes(store_->compareSet(key, toVector(expected), toVector(desired)));
  });
}

void TorchStoreAdapter::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  if (keys.empty()) return;
  const auto started = std::chrono::steady_clock::now();
  try {
    // c10d reads a zero timeout as "none": at least 1 ms.
    store_->wait(keys, std::max(timeout, milliseconds(1)));
  } catch (const std::exception& e) {
    auto waited = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - started);
    if (waited >= timeout)
      throw TimeoutError("torch store: wait timed out after " + std::to_string(waited.count()) +
                         "ms on " + listKeys(keys) + " (" + e.what() + ")");
    throw NetworkError("torch store: wait on " + listKeys(keys) + " failed: " + e.what());
  }
}

bool TorchStoreAdapter::check(const std::vector<std::string>& keys) {
  return guarded("check " + listKeys(keys), [&] { return store_->check(keys); });
}

bool TorchStoreAdapter::deleteKey(const std::string& key) {
  return guarded("delete " + key, [&] { return store_->deleteKey(key); });
}

int64_t TorchStoreAdapter::numKeys() {
  return guarded("num_keys", [&] { return store_->getNumKeys(); });
}

std::vector<rdzv::Bytes> TorchStoreAdapter::multiGet(const std::vector<std::string>& keys,
                                                     milliseconds timeout) {
  wait(keys, timeout);
  std::vector<rdzv::Bytes> values;
  values.reserve(keys.size());
  for (const auto& key : keys)
    values.push_back(guarded("get " + key, [&] { return toBytes(store_->get(key)); }));
  return values;
}

void TorchStoreAdapter::multiSet(const std::vector<std::string>& keys,
                                 const std::vector<rdzv::Bytes>& values) {
  if (keys.size() != values.size())
    throw InvalidArgument("torch store: multiSet of " + std::to_string(keys.size()) + " keys and " +
                          std::to_string(values.size()) + " values");
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

void TorchStoreAdapter::append(const std::string& key, const rdzv::Bytes& value) {
  for (;;) {
    rdzv::Bytes old = tryGet(key).value_or("");
    if (compareSet(key, old, old + value) == old + value) return;
  }
}

}  // namespace drun::torch_backend

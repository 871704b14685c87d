#include "worker_store.hpp"

#include <algorithm>

#include "drun/common/error.hpp"
#include "drun/store/prefix_store.hpp"
#include "drun/store/tcp_store.hpp"

namespace drun::torch_backend {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

rdzv::Bytes bytesOf(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }
std::vector<uint8_t> vectorOf(const rdzv::Bytes& b) { return {b.begin(), b.end()}; }

// c10d's "no timeout" (0) still gets a deadline: the store's own.
milliseconds deadlineOf(milliseconds asked, milliseconds store) {
  return asked > milliseconds(0) ? asked : store;
}

}  // namespace

WorkerStore::WorkerStore(const WorkerStoreOptions& options) : c10d::Store(options.timeout) {
  if (options.host.empty() || options.port == 0)
    throw InvalidArgument("workers' store: no host:port (DRUN_WORKER_STORE)");
  rdzv::TcpStoreOptions o;
  o.endpoint = {options.host, options.port};
  o.token = options.token;
  o.connectTimeout = options.timeout;
  o.timeout = options.timeout;
  auto tcp = std::make_shared<rdzv::TcpStore>(o);
  endpoint_ = tcp->endpoint();
  store_ = std::make_shared<rdzv::PrefixStore>(options.prefix, std::move(tcp));
}

void WorkerStore::abandon(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    reason_ = reason;
  }
  abandoned_ = true;
}

void WorkerStore::checkAbandoned() const {
  if (!abandoned_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  throw Error("workers' store at " + endpoint_ + ": " + reason_);
}

void WorkerStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  store_->set(key, bytesOf(value));
}

std::vector<uint8_t> WorkerStore::compareSet(const std::string& key,
                                             const std::vector<uint8_t>& expected,
                                             const std::vector<uint8_t>& desired) {
  return vectorOf(store_->compareSet(key, bytesOf(expected), bytesOf(desired)));
}

std::vector<uint8_t> WorkerStore::get(const std::string& key) {
  wait({key}, timeout_);
  return vectorOf(store_->get(key, kSlice));
}

void WorkerStore::settle(const std::string& key, int64_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  settled_[key] = count;
}

int64_t WorkerStore::add(const std::string& key, int64_t value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = settled_.find(key); it != settled_.end()) return it->second;
  }
  checkAbandoned();  // torch's store-based barrier polls add(): it ends too
  return store_->add(key, value);
}

bool WorkerStore::deleteKey(const std::string& key) { return store_->deleteKey(key); }

bool WorkerStore::check(const std::vector<std::string>& keys) { return store_->check(keys); }

int64_t WorkerStore::getNumKeys() { return store_->numKeys(); }

void WorkerStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void WorkerStore::wait(const std::vector<std::string>& keys, const milliseconds& timeout) {
  const auto deadline = Clock::now() + deadlineOf(timeout, timeout_);
  for (;;) {
    checkAbandoned();
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    try {
      store_->wait(keys, std::clamp(left, milliseconds(1), kSlice));
      return;
    } catch (const TimeoutError&) {
      if (Clock::now() >= deadline) throw;
    }
  }
}

std::optional<std::string> WorkerStore::tryGet(const std::string& key) { return store_->tryGet(key); }

std::optional<std::string> WorkerStore::watch(const std::string& key,
                                              const std::optional<std::string>& known,
                                              milliseconds timeout) {
  return store_->watch(key, known, timeout);
}

void WorkerStore::interrupt() { store_->interrupt(); }

}  // namespace drun::torch_backend

// HookStore: a Store decorator over one connection of a simulated node (a MemoryStore handle,
// or an EtcdStore: interleaving_backend.hpp) that calls a hook before every store operation, so
// that a test can run an injection (another node's will fires, a connection drops, a delay, a
// newcomer arrives) at an exact point of a rendezvous call. The interleaving tests
// (interleaving_*_test.cpp) enumerate those points.
//
// Each operation is named by (node, rendezvous call, the call's occurrence on that node, index of
// the operation within the call, op name, first key). Every connection of one simulated node
// (its own, its membership watchers', a reconnection's) shares one NodeLink: the node's name, the
// hook, and the call in progress, which the test's agent model brackets with
// beginCall()/endCall() on the node's agent thread. Only that thread's operations inside a call
// are counted and hooked.
//
// A batch (runBatch) is a point per operation too. With Batches::OneByOne (etcd, whose batches
// are calls in order) its operations run one by one, each hooked before it runs. With
// Batches::Atomic (MemoryStore, as the drun store server: a batch is one write, served in one
// pass) the batch reaches the store whole or not at all: its first operation's hook runs before
// the store applies it (a cut there: the request is lost, nothing applied), the others' hooks
// after (a cut there: the answer is lost, everything applied, the will set in it included).
//
// drop() models a connection that closed: the backend's closeConnection runs now (over
// MemoryStore the handle's will, as a TCP store server runs it; over etcd the call in flight
// ends: a connection is not liveness there) and every later operation throws NetworkError, as a
// TcpStore's would. NodeLink::dropAll(forGood) is the node cut off (false) or dead (true): the
// backend's onCut runs first (over etcd: the node's lease ends, so the others apply its will),
// then all its connections drop, and with forGood new ones are refused.
//
// Threading: the operations run on the caller's thread (the hook too, synchronously, with no
// lock held); drop(), dropAll() and blockedInWatch() may be called from any thread.
// Ownership: a HookStore owns its inner store (destroying a MemoryStore handle runs the will, if
// any is left); NodeLink is shared by the node's connections.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "drun/common/deadline.hpp"
#include "drun/common/error.hpp"
#include "drun/store/store.hpp"
#include "drun/store/store_batch.hpp"

namespace drun::rdzv::test {

struct StoreOp {
  std::string node;
  std::string call;    // "join" (next), "finish", "leave", "report" (reportFailure); "" = none
  int occurrence = 0;  // 1 = this node's first call of that kind
  int index = 0;       // 0 = the call's first store operation
  std::string name;    // "set", "tryGet", "watch", ...
  std::string key;     // its first key ("" when it has none)

  std::string describe() const {
    return node + " " + (call.empty() ? "(no call)" : call + "#" + std::to_string(occurrence)) +
           " op " + std::to_string(index) + " " + name + "(" + key + ")";
  }
};

class HookStore;

// What every connection of one simulated node shares: its name, the hook, the rendezvous call in
// progress on the node's agent thread (only that thread's operations are counted: the membership
// watcher's run on threads of their own), and the connections open now (to drop them all).
class NodeLink {
 public:
  using Hook = std::function<void(const StoreOp&)>;

  // `changed` (may be empty) is called whenever blockedInWatch() or dropped state may have
  // changed, so that a waiter on another thread looks again.
  NodeLink(std::string node, Hook hook, std::function<void()> changed)
      : node_(std::move(node)), hook_(std::move(hook)), changed_(std::move(changed)) {}

  const std::string& node() const { return node_; }

  // Called on the node's agent thread around each rendezvous call.
  void beginCall(const std::string& call) {
    std::lock_guard lock(mutex_);
    agentThread_ = std::this_thread::get_id();
    call_ = call;
    occurrence_ = ++occurrences_[call];
    index_ = 0;
  }
  void endCall() {
    std::lock_guard lock(mutex_);
    call_.clear();
  }

  // The node is cut off: onCut (if set) runs, then every open connection closes; with
  // `forGood`, new ones are refused.
  inline void dropAll(bool forGood);
  // What the backend does first when the node is cut off or dies (set once, before any drop).
  void setOnCut(std::function<void()> onCut) { onCut_ = std::move(onCut); }
  bool refused() const { return refused_.load(); }
  // The agent thread waits in a watch whose key still held the known value when it started.
  bool blockedInWatch() const { return blocked_.load(); }

 private:
  friend class HookStore;

  StoreOp next(const char* name, const std::string& key) {
    std::lock_guard lock(mutex_);
    StoreOp op;
    op.node = node_;
    op.name = name;
    op.key = key;
    if (!call_.empty() && std::this_thread::get_id() == agentThread_) {
      op.call = call_;
      op.occurrence = occurrence_;
      op.index = index_++;
    }
    return op;
  }
  bool onAgentThread() {
    std::lock_guard lock(mutex_);
    return std::this_thread::get_id() == agentThread_;
  }
  void setBlocked(bool blocked) {
    blocked_.store(blocked);
    notify();
  }
  void notify() {
    if (changed_) changed_();
  }

  const std::string node_;
  const Hook hook_;
  const std::function<void()> changed_;
  std::function<void()> onCut_;
  std::atomic<bool> refused_{false};
  std::atomic<bool> blocked_{false};
  std::mutex mutex_;
  std::thread::id agentThread_;
  std::string call_;
  int occurrence_ = 0;
  int index_ = 0;
  std::map<std::string, int> occurrences_;
  std::mutex openMutex_;  // guards open_; taken before a store's will runs
  std::set<HookStore*> open_;
};

class HookStore final : public LivenessStore {
 public:
  using CloseConnection = std::function<void(LivenessStore& inner)>;
  enum class Batches { OneByOne, Atomic };  // how the inner store applies a batch (above)

  // `slice`: how long one piece of a blocking call may be (below: sliced()); a backend whose
  // closeConnection ends a blocked call itself passes milliseconds::max().
  HookStore(std::shared_ptr<NodeLink> link, std::unique_ptr<LivenessStore> inner,
            CloseConnection closeConnection, milliseconds slice = milliseconds(20),
            Batches batches = Batches::OneByOne)
      : link_(std::move(link)),
        inner_(std::move(inner)),
        closeConnection_(std::move(closeConnection)),
        slice_(slice),
        batches_(batches) {
    if (link_->refused())
      throw NetworkError("test: " + link_->node() + " is dead: connection refused");
    std::lock_guard lock(link_->openMutex_);
    link_->open_.insert(this);
  }
  ~HookStore() override {
    std::lock_guard lock(link_->openMutex_);
    link_->open_.erase(this);
  }

  // The connection closes: the backend's closeConnection runs now; every later operation
  // throws NetworkError.
  void drop() {
    if (dropped_.exchange(true)) return;
    closeConnection_(*inner_);
  }

  void set(const std::string& key, const Bytes& value) override {
    before("set", key);
    inner_->set(key, value);
  }
  Bytes get(const std::string& key, milliseconds timeout) override {
    before("get", key);
    return sliced("get", key, timeout, [&](milliseconds slice) { return inner_->get(key, slice); });
  }
  std::optional<Bytes> tryGet(const std::string& key) override {
    before("tryGet", key);
    return inner_->tryGet(key);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    before("add", key);
    return inner_->add(key, delta);
  }
  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    before("compareSet", key);
    return inner_->compareSet(key, expected, desired);
  }
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    before("wait", first(keys));
    sliced("wait", first(keys), timeout, [&](milliseconds slice) {
      inner_->wait(keys, slice);
      return 0;
    });
  }
  bool check(const std::vector<std::string>& keys) override {
    before("check", first(keys));
    return inner_->check(keys);
  }
  bool deleteKey(const std::string& key) override {
    before("deleteKey", key);
    return inner_->deleteKey(key);
  }
  int64_t numKeys() override {
    before("numKeys", "");
    return inner_->numKeys();
  }
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys, milliseconds timeout) override {
    before("multiGet", first(keys));
    return sliced("multiGet", first(keys), timeout,
                  [&](milliseconds slice) { return inner_->multiGet(keys, slice); });
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override {
    before("multiSet", first(keys));
    inner_->multiSet(keys, values);
  }
  void append(const std::string& key, const Bytes& value) override {
    before("append", key);
    inner_->append(key, value);
  }
  std::optional<Bytes> watch(const std::string& key, const std::optional<Bytes>& known,
                             milliseconds timeout) override {
    before("watch", key);
    const bool agent = link_->onAgentThread();
    // Blocked: the value is still the one the caller knows (else the watch returns at once).
    if (agent) link_->setBlocked(inner_->tryGet(key) == known);
    try {
      auto value = sliced("watch", key, timeout,
                          [&](milliseconds slice) { return inner_->watch(key, known, slice); });
      if (agent) link_->setBlocked(false);
      return value;
    } catch (...) {
      if (agent) link_->setBlocked(false);
      throw;
    }
  }
  void setWill(const Will& will) override {
    before("setWill", "");
    inner_->setWill(will);
  }
  int64_t deletePrefix(const std::string& prefix) override {
    before("deletePrefix", prefix);
    return inner_->deletePrefix(prefix);
  }
  // As TcpStore's: the connection ends now (its will runs) and a blocked call returns within a
  // slice with NetworkError.
  void interrupt() override { drop(); }

  void runBatch(StoreBatch& batch) override {
    if (batches_ == Batches::OneByOne || batch.empty()) return LivenessStore::runBatch(batch);
    batch.clearOutcomes();
    before(opName(batch.op(0).kind), batch.op(0).key);  // a cut: the request lost
    std::exception_ptr failure;  // an operation's own error, thrown once every hook ran
    try {
      inner_->runBatch(batch);
    } catch (const NetworkError&) {
      throw;
    } catch (const std::exception&) {
      failure = std::current_exception();
    }
    try {
      for (size_t i = 1; i < batch.size(); ++i) before(opName(batch.op(i).kind), batch.op(i).key);
    } catch (const NetworkError&) {
      batch.clearOutcomes();  // the answer lost: the caller cannot know what ran
      throw;
    }
    if (failure) std::rethrow_exception(failure);
  }

 private:
  static const char* opName(StoreBatch::Kind kind) {
    switch (kind) {
      case StoreBatch::Kind::Set: return "set";
      case StoreBatch::Kind::TryGet: return "tryGet";
      case StoreBatch::Kind::Add: return "add";
      case StoreBatch::Kind::CompareSet: return "compareSet";
      case StoreBatch::Kind::Append: return "append";
      case StoreBatch::Kind::SetWill: return "setWill";
      case StoreBatch::Kind::DeleteKey: return "deleteKey";
      case StoreBatch::Kind::DeletePrefix: return "deletePrefix";
    }
    return "?";
  }
  static std::string first(const std::vector<std::string>& keys) {
    return keys.empty() ? std::string() : keys.front();
  }

  // A blocking call in slices: a connection that drops ends it within a slice, as a closed
  // socket ends a TcpStore call (MemoryStore drops a gone client's waiters without waking them).
  template <typename F>
  std::invoke_result_t<F&, milliseconds> sliced(const char* name, const std::string& key,
                                                milliseconds timeout, F&& f) {
    const Deadline deadline(timeout);
    for (;;) {
      throwIfDropped(name, key);
      try {
        return f(std::min(deadline.remaining(), slice_));
      } catch (const TimeoutError&) {
        if (deadline.expired())
          throw TimeoutError(std::string(name) + " timed out after " +
                             std::to_string(timeout.count()) + "ms on [" + key + "] (test store)");
      }
    }
  }

  void before(const char* name, const std::string& key) {
    throwIfDropped(name, key);
    const StoreOp op = link_->next(name, key);
    // Only the agent thread's calls are hooked: a membership watcher's thread may outlive the test.
    if (link_->hook_ && !op.call.empty()) link_->hook_(op);
    throwIfDropped(name, key);  // the hook may have dropped this very connection
  }

  void throwIfDropped(const char* name, const std::string& key) const {
    if (dropped_.load())
      throw NetworkError("test: " + link_->node() + "'s store connection dropped (" + name + " " +
                         key + ")");
  }

  std::shared_ptr<NodeLink> link_;
  std::unique_ptr<LivenessStore> inner_;
  const CloseConnection closeConnection_;
  const milliseconds slice_;
  const Batches batches_;
  std::atomic<bool> dropped_{false};
};

void NodeLink::dropAll(bool forGood) {
  if (forGood) refused_.store(true);
  if (onCut_) onCut_();
  {
    std::lock_guard lock(openMutex_);
    for (HookStore* store : open_) store->drop();
  }
  notify();
}

}  // namespace drun::rdzv::test

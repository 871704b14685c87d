// MemoryStore: the Store contract in-process, without sockets. Used by tests, and wherever the
// agents of one process (or an embedding) want the store without a network hop.
//
// State lives in one MemoryStore::Shared (a StoreCore under a mutex); each MemoryStore object is
// a handle on it and counts as one "client" for the last will: the will registered through a
// handle runs when that handle is destroyed or when fireWillForTest() is called, exactly like a
// TcpStore connection closing. Handles are cheap; make one per simulated node. A batch
// (runBatch) is applied in one step under the state's lock, as the store server serves a batch's
// requests in one pass: no other handle's call, and no will, comes between two of its operations.
//
// Threading: every method is thread-safe; blocking calls (get/wait/multiGet/watch) wait on a
// condition variable until woken by another handle's write or until their deadline.
// Ownership: a handle keeps the Shared state alive (shared_ptr).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "drun/common/deadline.hpp"

#include "drun/store/store.hpp"

namespace drun::rdzv {

class MemoryStore final : public LivenessStore {
 public:
  class Shared;  // opaque: StoreCore + mutex + condition variable
  static std::shared_ptr<Shared> makeShared();

  // A handle on `shared`; a default-constructed MemoryStore owns fresh state of its own.
  explicit MemoryStore(std::shared_ptr<Shared> shared = makeShared());
  ~MemoryStore() override;  // runs this handle's will
  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  // Another handle (another "client") on the same state.
  std::unique_ptr<MemoryStore> clone() const;
  const std::shared_ptr<Shared>& shared() const { return shared_; }

  // Runs this handle's will now (as if its connection dropped); the handle stays usable and has
  // no will afterwards.
  void fireWillForTest();
  // The connection closes: the will runs, and every later call throws NetworkError, as a
  // TcpStore's after the server closed it (a request that did not reach the store is never
  // applied, whatever thread was about to send it).
  void closeForTest();

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
  void runBatch(StoreBatch& batch) override;

 private:
  // The state's lock, once sure this handle is not closed (closeForTest).
  std::unique_lock<std::mutex> lockOpen() const;

  static void waitUntilPresent(Shared& shared, uint64_t client,
                               const std::vector<std::string>& keys, Deadline deadline,
                               milliseconds timeout, const char* what,
                               std::unique_lock<std::mutex>& lock);

  std::shared_ptr<Shared> shared_;
  uint64_t clientId_;
  bool closed_ = false;  // guarded by the state's lock
};

}  // namespace drun::rdzv

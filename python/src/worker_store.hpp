// WorkerStore: torch's c10d::Store over the workers' store (drun's TcpStore, under a key prefix):
// what torch's env:// rendezvous hands init_process_group under `drun --recovery in-process`, so
// that the store outlives every rank (the agent or the rendezvous store serves it, not rank 0).
// The reverse of TorchStoreAdapter.
//
// Blocking calls (get, wait) have the store's timeout (c10d's setTimeout) as their deadline, and
// wait in slices of at most kSlice so that abandon() ends them early: the recovery that this
// store's generation belongs to was superseded, and a rank still waiting for a peer of that
// generation must give up (drun::Error naming the reason) instead of waiting out its timeout.
// add() fails once abandoned too: torch's store-based barrier waits by polling it.
// watch() and interrupt() are the LivenessStore's, for the generation watcher. settle() makes a
// counter this process's own: torch's store-based barrier over it passes at once (the default
// "drun" group's barrier, which its communicator's forming already was).
//
// Threading: thread-safe (TcpStore serialises the calls on its one connection; a watch holds it
// until it returns, so a watcher uses a WorkerStore of its own). Owns the connection.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "drun/store/store.hpp"

namespace drun::torch_backend {

struct WorkerStoreOptions {
  std::string host;
  uint16_t port = 0;
  std::string prefix;  // every key is prefix + key (the round's prefix P, and torch's own part)
  std::string token;   // the store's shared secret ("" = none)
  std::chrono::milliseconds timeout{300000};  // connect and call deadline; c10d's timeout
};

class WorkerStore final : public c10d::Store {
 public:
  static constexpr std::chrono::milliseconds kSlice{200};

  // Connects (retrying until the timeout). Throws drun::Error naming the store.
  explicit WorkerStore(const WorkerStoreOptions& options);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  std::optional<std::string> tryGet(const std::string& key);
  // Blocks until `key` differs from `known` (nullopt = absent) or the timeout; returns the value
  // then (nullopt = absent). Throws TimeoutError at the deadline, NetworkError once interrupted.
  std::optional<std::string> watch(const std::string& key, const std::optional<std::string>& known,
                                   std::chrono::milliseconds timeout);
  // Ends the connection: a watch in another thread returns at once (NetworkError).
  void interrupt();
  // Every blocking call now and later fails within kSlice, naming `reason`.
  void abandon(const std::string& reason);
  // add() on `key` returns `count` from now on and never reaches the store.
  void settle(const std::string& key, int64_t count);
  const std::string& endpoint() const { return endpoint_; }

 private:
  void checkAbandoned() const;

  std::shared_ptr<rdzv::LivenessStore> store_;  // a PrefixStore over the TcpStore
  std::string endpoint_;
  std::atomic<bool> abandoned_{false};
  mutable std::mutex mutex_;
  std::string reason_;
  std::map<std::string, int64_t> settled_;  // guarded by mutex_, as reason_ is
};

}  // namespace drun::torch_backend

// Store: the key-value interface every rendezvous, agent and comm bootstrap talks to, and
// LivenessStore: the same plus what liveness needs (watch, will, deletePrefix, interrupt).
//
// Implementations: MemoryStore (in-process, for tests and the embedded fast path) and TcpStore
// (client of StoreServer over the wire protocol) are LivenessStores; one contract test runs
// against both. FileStore (libdrun_comm's file://) and PrefixStore's key-value view are Stores.
//
// Threading: implementations are safe to call from several threads; a call blocks at most until
// its deadline (every blocking call takes a timeout) and throws TimeoutError naming the keys,
// the server and the time waited. Values are arbitrary bytes (std::string used as a byte buffer).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "drun/common/error.hpp"

namespace drun::rdzv {

using Bytes = std::string;
using std::chrono::milliseconds;
class StoreBatch;  // store_batch.hpp

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits until `key` exists (or timeout), then returns its value.
  virtual Bytes get(const std::string& key, milliseconds timeout) = 0;
  // Returns the value, or nullopt at once when the key does not exist.
  virtual std::optional<Bytes> tryGet(const std::string& key) = 0;
  // Adds `delta` to the int64 stored (as decimal ASCII, like torch's TCPStore) under key;
  // a missing key counts as 0. Returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // torch TCPStore semantics: missing key + empty expected -> store desired; key equal to
  // expected -> store desired; always returns the value now stored (or `expected` when the key
  // is missing and expected is non-empty).
  virtual Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) = 0;
  // Blocks until every key exists. Throws TimeoutError listing the keys still missing.
  virtual void wait(const std::vector<std::string>& keys, milliseconds timeout) = 0;
  // True when every key exists (no blocking).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Returns true when the key existed.
  virtual bool deleteKey(const std::string& key) = 0;
  virtual int64_t numKeys() = 0;
  // Waits until all keys exist, then returns their values in order.
  virtual std::vector<Bytes> multiGet(const std::vector<std::string>& keys, milliseconds timeout) = 0;
  virtual void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) = 0;
  // Appends to the value (creates the key when missing).
  virtual void append(const std::string& key, const Bytes& value) = 0;

  // A will (LivenessStore::setWill): sets, adds and deletes, as the wire and the store core carry
  // it.
  struct Will {
    std::vector<std::pair<std::string, Bytes>> sets;
    std::vector<std::pair<std::string, int64_t>> adds;
    std::vector<std::string> deletes;
  };
};

// LivenessStore: what the rendezvous and libdrun_comm's peer-death detection need beyond keys
// and values: change notification, a connection's "last will", removing a job's keys, and ending
// a blocked call from another thread. TcpStore and MemoryStore are LivenessStores; a store that
// cannot tell when a client goes away (FileStore: a shared file) is only a Store.
class LivenessStore : public Store {
 public:
  // Change notification without polling: blocks until the value of `key` differs from `known`
  // (nullopt = "absent"), then returns the new value (nullopt = deleted/absent). Throws
  // TimeoutError at the deadline.
  virtual std::optional<Bytes> watch(const std::string& key, const std::optional<Bytes>& known,
                                     milliseconds timeout) = 0;

  // Liveness ("last will"): operations the server performs when THIS client's connection closes
  // or its heartbeat lease lapses. Each registered `set` is applied and each `add` is added, and
  // waiters/watchers are woken, exactly as if the client had issued them. Replaces any will set
  // earlier on this connection. For MemoryStore the will runs when the Store object is destroyed
  // or fireWillForTest() is called.
  virtual void setWill(const Will& will) = 0;

  // Removes every key that starts with `prefix` (non-empty) and returns how many were removed;
  // watchers of those keys are woken. The last agent to leave a job calls
  // deletePrefix("rdzv/<run_id>/") so a long-lived daemon does not keep finished jobs' keys.
  virtual int64_t deletePrefix(const std::string& prefix) = 0;

  // The job under `prefix` ended and its last node left, having removed all but what tells how
  // it ended (its outcome, round and history: `drun status`): that stays for `keep`, then may go.
  // Default: kept as long as the store is (an agent's store ends with it; drun-rendezvous bounds
  // the history it keeps). EtcdStore binds it to a lease of that TTL.
  virtual void expireEndedJob(const std::string& /*prefix*/, milliseconds /*keep*/) {}

  // Ends this client's connection now, from any thread: a call blocked in another thread returns
  // at once with NetworkError instead of at its deadline (a watcher being stopped does not hold a
  // connection for a whole watch). The will runs as on any close. Default: nothing to end.
  virtual void interrupt() {}

  // Runs independent operations handed over together (store_batch.hpp says what a batch
  // means). Default: one call after another, through this store's own calls. TcpStore sends
  // them pipelined: one round trip for the batch.
  virtual void runBatch(StoreBatch& batch);
};

}  // namespace drun::rdzv

// StoreBatch: independent store operations that a caller hands over together
// (LivenessStore::runBatch), so that a networked store sends them in one round trip. TcpStore
// pipelines them on its connection (one write; the server runs them in order and answers them
// with one write); every other store runs them one after another (LivenessStore's default), so a
// wrapper (PrefixStore, a test's hooked store) sees each operation, in order, as before.
//
// What a batch means, whichever store runs it:
//   - the operations run in the order they were added, each as the call of the same name would;
//     they are not atomic together (another client's operation may come between two of them);
//   - each is attempted even when one before it failed (a pipelined store has already sent
//     them all and its server answers each); runBatch then rethrows the first failure, and
//     ok(i) tells each operation's own outcome;
//   - a NetworkError (the connection lost) ends the batch at once: an operation whose answer did
//     not come may or may not have run, as for a single call whose reply was lost;
//   - against a lost connection, a batch is whole or nothing on MemoryStore (one step under its
//     lock) and on the drun store server (one write, served in one pass; docs/rendezvous.md,
//     "One round", says what is left); EtcdStore makes a will and the +-1 add right after it one
//     transaction (a node counted in `present` with the will that counts it out). Elsewhere it is
//     not.
// So only operations that do not depend on each other's results belong in one batch.
//
// At most kMaxOps operations (InvalidArgument beyond), so that the answers of one batch never
// fill what a server queues for one connection. Only calls that do not block are offered.
// EtcdStore runs a batch as one etcd transaction where it can (atomic besides: etcd_store.hpp).
//
// Threading: a value; one batch is run by one thread at a time.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "drun/store/store.hpp"

namespace drun::rdzv {

class StoreBatch {
 public:
  static constexpr size_t kMaxOps = 64;

  enum class Kind : uint8_t { Set, TryGet, Add, CompareSet, Append, SetWill, DeleteKey, DeletePrefix };
  struct Op {
    Kind kind = Kind::TryGet;
    std::string key;    // every kind but SetWill
    Bytes value;        // Set, Append: the value; CompareSet: the expected value
    Bytes desired;      // CompareSet
    int64_t delta = 0;  // Add
    Store::Will will;   // SetWill
  };
  struct Outcome {
    bool ran = false;            // answered (with a result or an error)
    std::optional<Bytes> value;  // TryGet: the value (nullopt: absent); CompareSet: now stored
    int64_t number = 0;          // Add: the new value; DeleteKey: 1 if it existed, else 0;
                                 // DeletePrefix: the keys removed
    std::exception_ptr error;    // the operation's own failure
  };

  // Each adds one operation and returns its index. InvalidArgument past kMaxOps.
  size_t set(std::string key, Bytes value);
  size_t tryGet(std::string key);
  size_t add(std::string key, int64_t delta);
  size_t compareSet(std::string key, Bytes expected, Bytes desired);
  size_t append(std::string key, Bytes value);
  size_t setWill(Store::Will will);
  size_t deleteKey(std::string key);
  size_t deletePrefix(std::string prefix);  // InvalidArgument for an empty prefix

  size_t size() const { return ops_.size(); }
  bool empty() const { return ops_.empty(); }
  const Op& op(size_t i) const { return ops_.at(i); }

  // After runBatch. ok: the operation ran without an error. value/number rethrow the
  // operation's own error (or throw Error when it never ran).
  bool ok(size_t i) const;
  const std::optional<Bytes>& value(size_t i) const;
  int64_t number(size_t i) const;

  // For implementations of runBatch.
  Outcome& outcome(size_t i) { return outcomes_.at(i); }
  void clearOutcomes();
  void rethrowFirstFailure() const;

 private:
  size_t push(Op op);
  const Outcome& checked(size_t i) const;

  std::vector<Op> ops_;
  std::vector<Outcome> outcomes_;
};

// Runs operation i of `batch` through the store's own call of that name and records its outcome;
// rethrows a NetworkError (the rest cannot run). LivenessStore's runBatch does so for each.
void runBatchOp(LivenessStore& store, StoreBatch& batch, size_t i);

}  // namespace drun::rdzv

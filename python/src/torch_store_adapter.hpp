// TorchStoreAdapter: drun's rdzv::Store over the torch c10d::Store that init_process_group gives
// a backend (TCPStore, FileStore, HashStore, wrapped in a PrefixStore per group), so that
// libdrun_comm bootstraps through it with drun::comm::init(store, options).
//
// Every blocking call has a deadline: get/multiGet/wait wait for the keys with the caller's
// timeout (c10d's wait) before reading them. c10d's errors become drun's: a wait that ran out its
// time is a TimeoutError naming the keys, anything else a NetworkError naming the call. A torch
// Store has no wills or watches, so this is a Store, not a LivenessStore: a dead peer is named by
// the transport (shared memory's pidfds), not by the store.
//
// Threading: as thread-safe as the c10d::Store (torch's stores lock per call). Holds a reference
// to the store.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "drun/store/store.hpp"

namespace drun::torch_backend {

using std::chrono::milliseconds;

class TorchStoreAdapter final : public rdzv::Store {
 public:
  explicit TorchStoreAdapter(c10::intrusive_ptr<c10d::Store> store);

  void set(const std::string& key, const rdzv::Bytes& value) override;
  rdzv::Bytes get(const std::string& key, milliseconds timeout) override;
  std::optional<rdzv::Bytes> tryGet(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  rdzv::Bytes compareSet(const std::string& key, const rdzv::Bytes& expected,
                         const rdzv::Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  std::vector<rdzv::Bytes> multiGet(const std::vector<std::string>& keys,
                                    milliseconds timeout) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<rdzv::Bytes>& values) override;
  // c10d 1.13 has no append: a compare-and-set loop.
  void append(const std::string& key, const rdzv::Bytes& value) override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace drun::torch_backend

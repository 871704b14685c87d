// PrefixStore: a view of another Store in which every key is prefixed ("comm/g1/" + key), so that
// several users (groups, rounds, jobs) share one store without their keys colliding.
//
// Every operation forwards to the underlying store with the prefix prepended (also in wills and
// deletePrefix); numKeys() counts the whole underlying store. Errors are the underlying store's.
// The liveness operations need an underlying LivenessStore: over a plain Store (FileStore) they
// throw InvalidArgument saying so (hasLiveness() tells beforehand).
// Threading: as thread-safe as the underlying store. Ownership: shares the underlying store.
#pragma once

#include <memory>
#include <string>

#include "drun/store/store.hpp"

namespace drun::rdzv {

class PrefixStore final : public LivenessStore {
 public:
  // Throws InvalidArgument when `store` is null.
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& underlying() const { return store_; }
  bool hasLiveness() const { return liveness_ != nullptr; }

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
  void interrupt() override;

 private:
  LivenessStore& liveness(const char* what) const;
  std::string k(const std::string& key) const { return prefix_ + key; }
  std::vector<std::string> k(const std::vector<std::string>& keys) const;

  std::string prefix_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<LivenessStore> liveness_;  // store_, when it is one
};

}  // namespace drun::rdzv

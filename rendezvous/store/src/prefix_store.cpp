#include "drun/store/prefix_store.hpp"

#include "drun/common/error.hpp"

namespace drun::rdzv {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : prefix_(std::move(prefix)),
      store_(std::move(store)),
      liveness_(std::dynamic_pointer_cast<LivenessStore>(store_)) {
  if (!store_) throw InvalidArgument("PrefixStore('" + prefix_ + "'): no underlying store");
}

LivenessStore& PrefixStore::liveness(const char* what) const {
  if (!liveness_)
    throw InvalidArgument(std::string(what) + " under '" + prefix_ +
                          "': the underlying store has no liveness (a file store)");
  return *liveness_;
}

std::vector<std::string> PrefixStore::k(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& key : keys) out.push_back(k(key));
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) { store_->set(k(key), value); }
Bytes PrefixStore::get(const std::string& key, milliseconds timeout) {
  return store_->get(k(key), timeout);
}
std::optional<Bytes> PrefixStore::tryGet(const std::string& key) { return store_->tryGet(k(key)); }
int64_t PrefixStore::add(const std::string& key, int64_t delta) { return store_->add(k(key), delta); }
Bytes PrefixStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  return store_->compareSet(k(key), expected, desired);
}
void PrefixStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  store_->wait(k(keys), timeout);
}
bool PrefixStore::check(const std::vector<std::string>& keys) { return store_->check(k(keys)); }
bool PrefixStore::deleteKey(const std::string& key) { return store_->deleteKey(k(key)); }
int64_t PrefixStore::numKeys() { return store_->numKeys(); }
std::vector<Bytes> PrefixStore::multiGet(const std::vector<std::string>& keys,
                                         milliseconds timeout) {
  return store_->multiGet(k(keys), timeout);
}
void PrefixStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  store_->multiSet(k(keys), values);
}
void PrefixStore::append(const std::string& key, const Bytes& value) {
  store_->append(k(key), value);
}
std::optional<Bytes> PrefixStore::watch(const std::string& key, const std::optional<Bytes>& known,
                                        milliseconds timeout) {
  return liveness("watch").watch(k(key), known, timeout);
}
void PrefixStore::setWill(const Will& will) {
  Will prefixed;
  for (const auto& [key, value] : will.sets) prefixed.sets.emplace_back(k(key), value);
  for (const auto& [key, delta] : will.adds) prefixed.adds.emplace_back(k(key), delta);
  prefixed.deletes = k(will.deletes);
  liveness("setWill").setWill(prefixed);
}
void PrefixStore::interrupt() {
  if (liveness_) liveness_->interrupt();
}
int64_t PrefixStore::deletePrefix(const std::string& prefix) {
  if (prefix.empty()) throw InvalidArgument("deletePrefix: the prefix must not be empty");
  return liveness("deletePrefix").deletePrefix(k(prefix));
}

}  // namespace drun::rdzv

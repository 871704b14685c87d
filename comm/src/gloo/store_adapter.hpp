// GlooStoreAdapter: drun's Store seen through Gloo's rendezvous::Store interface (set, get,
// wait), so that gloo::rendezvous::Context::connectFullMesh exchanges addresses through drun's
// store. Every call is bounded by the timeout given at construction. Thread-safe as the store.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>

#include "drun/store/store.hpp"

namespace drun::comm::detail {

class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<rdzv::Store> store, std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, rdzv::Bytes(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    rdzv::Bytes value = store_->get(key, timeout_);
    return {value.begin(), value.end()};
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  // Gloo passes its context's timeout, which while the pairs connect is the connect slice
  // (gloo_backend.cpp), not how long a peer may take to arrive: the operation's bound is ours.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    store_->wait(keys, timeout_);
  }

 private:
  std::shared_ptr<rdzv::Store> store_;
  std::chrono::milliseconds timeout_;
};

}  // namespace drun::comm::detail

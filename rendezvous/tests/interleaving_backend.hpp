// Where the interleaving tests' simulated nodes keep their store: one MemoryStore::Shared (the
// default: exact, every will runs inside the injection), or a real 3-member etcd cluster through
// EtcdStore (the same scenarios and invariants over the etcd binding). A backend hands
// each node a connector, whose connections are HookStores, so the hook sees the same operations
// on either.
//
// Over etcd a node's connections share one session (one lease), as makeEtcdRendezvous' do; a
// node cut off or killed has its lease ended at once (endLeaseForTest: its will is applied by the
// other sessions' executors, as after its TTL, without waiting the TTL) and its next connection
// opens a new session. Each Cluster gets a key prefix of its own on the process's one etcd
// cluster (started at the first use; the test is SKIPPED where etcd is not installed).
//
// Threading: a connector may be called from any of the node's threads; onCut from the driver's.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "drun/etcd/etcd_store.hpp"
#include "drun/store/memory_store.hpp"
#include "drun/rendezvous/rendezvous.hpp"
#include "etcd_cluster.hpp"
#include "hook_store.hpp"

namespace drun::rdzv::test {

using Connector = std::function<std::unique_ptr<LivenessStore>()>;

inline constexpr milliseconds kEtcdLeaseTtl{4000};

class StoreBackend {
 public:
  virtual ~StoreBackend() = default;
  // The node's connections (each a HookStore on `link`); may set link->setOnCut.
  virtual Connector connector(const std::shared_ptr<NodeLink>& link,
                              const RendezvousOptions& options) = 0;
  virtual std::string endpoint() const = 0;  // for messages
};

class MemoryBackend final : public StoreBackend {
 public:
  explicit MemoryBackend(std::shared_ptr<MemoryStore::Shared> shared) : shared_(std::move(shared)) {}

  Connector connector(const std::shared_ptr<NodeLink>& link, const RendezvousOptions&) override {
    return [link, shared = shared_]() -> std::unique_ptr<LivenessStore> {
      // A TCP store server runs a closed connection's will at once and applies nothing it sends
      // after: so does the handle. It applies a batch in one step, as the server does.
      return std::make_unique<HookStore>(
          link, std::make_unique<MemoryStore>(shared),
          [](LivenessStore& inner) { static_cast<MemoryStore&>(inner).closeForTest(); },
          milliseconds(20), HookStore::Batches::Atomic);
    };
  }
  std::string endpoint() const override { return "memory"; }

 private:
  std::shared_ptr<MemoryStore::Shared> shared_;
};

// The process's etcd cluster for interleaving runs (members killed by PID at exit).
inline const drun::test::EtcdCluster& interleavingEtcdCluster() {
  static drun::test::EtcdCluster cluster;
  return cluster;
}

class EtcdBackend final : public StoreBackend {
 public:
  EtcdBackend() : prefix_(uniquePrefix()) {}

  Connector connector(const std::shared_ptr<NodeLink>& link,
                      const RendezvousOptions& options) override {
    EtcdStoreOptions store;
    store.client.endpoints = interleavingEtcdCluster().endpoints();
    store.client.callTimeout = options.readTimeout;
    store.prefix = prefix_;
    store.scope = options.runId;
    // A node killed or cut off has its lease ended at once (onCut), so the TTL only has to
    // outlast a starved keep-alive: a 1 s lease (the short options' heartbeat) can end on a
    // heavily loaded machine (CI runs two tests beside each other), and the node would re-join
    // as a newcomer in the middle of the enumerated call.
    store.leaseTtl = std::max<milliseconds>(options.heartbeatTimeout, kEtcdLeaseTtl);
    store.connectTimeout = options.joinTimeout;
    store.jobLeaseTtl = options.etcdHistoryTtl;
    auto sessions = std::make_shared<NodeSessions>(store);
    link->setOnCut([sessions] { sessions->endLease(); });
    return [link, sessions]() -> std::unique_ptr<LivenessStore> {
      if (link->refused())
        throw NetworkError("test: " + link->node() + " is dead: connection refused");
      // A connection closing is no event to etcd: it only ends the call in flight.
      return std::make_unique<HookStore>(
          link, std::make_unique<EtcdStore>(sessions->current()),
          [](LivenessStore& inner) { inner.interrupt(); }, milliseconds::max());
    };
  }
  std::string endpoint() const override { return "etcd " + interleavingEtcdCluster().list() + prefix_; }

 private:
  // A node's session: shared by its connections, replaced once lost (makeEtcdRendezvous' rule).
  class NodeSessions {
   public:
    explicit NodeSessions(EtcdStoreOptions options) : options_(std::move(options)) {}
    std::shared_ptr<EtcdSession> current() {
      std::lock_guard lock(mutex_);
      if (!session_)
        session_ = openEtcdSession(options_);
      else if (etcdSessionLost(*session_))
        session_ = replaceLostEtcdSession(options_, *session_);
      return session_;
    }
    void endLease() {
      std::lock_guard lock(mutex_);
      if (!session_ || etcdSessionLost(*session_)) return;
      try {
        endLeaseForTest(*session_);
      } catch (const std::exception& e) {
        // Its lease then ends by its TTL: later, but the same outcome.
        spdlog::warn("interleaving test: revoking a lease: {}", e.what());
      }
    }

   private:
    std::mutex mutex_;
    const EtcdStoreOptions options_;
    std::shared_ptr<EtcdSession> session_;
  };

  static std::string uniquePrefix() {
    static std::atomic<int> clusters{0};
    return "/drun-interleaving/" + std::to_string(::getpid()) + "-" + std::to_string(clusters++) + "/";
  }

  const std::string prefix_;
};

}  // namespace drun::rdzv::test

// A c10d rendezvous of one simulated node over a shared MemoryStore, its every store operation
// going through the node's NodeLink (hook_store.hpp): what the vacancy and grow interleaving tests
// kill, cut or pause at an exact point.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "c10d_test_support.hpp"
#include "hook_store.hpp"
#include "interleaving_backend.hpp"
#include "interleaving_harness.hpp"

namespace drun::rdzv::test {

struct HookedAgent {
  std::shared_ptr<NodeLink> link;
  std::unique_ptr<Rendezvous> rendezvous;
};

// `lastCall`: how long a round that reached MIN waits for more nodes (shortOptions' when unset).
inline HookedAgent hookedAgent(const std::shared_ptr<MemoryStore::Shared>& shared, const std::string& name,
                               NodeLink::Hook hook, int minNodes, int maxNodes, const std::string& runId,
                               std::optional<std::chrono::milliseconds> lastCall = std::nullopt) {
  HookedAgent agent;
  agent.link = std::make_shared<NodeLink>(name, std::move(hook), nullptr);
  RendezvousOptions o = shortOptions(minNodes, maxNodes, runId);
  if (lastCall) o.lastCallTimeout = *lastCall;
  o.localAddr = name;
  C10dStoreAccess access;
  Connector connect = MemoryBackend(shared).connector(agent.link, o);
  access.store = connect();
  access.connectWatcher = std::move(connect);
  access.endpoint = "memory";
  agent.rendezvous = makeC10dRendezvous(o, std::move(access));
  return agent;
}

}  // namespace drun::rdzv::test

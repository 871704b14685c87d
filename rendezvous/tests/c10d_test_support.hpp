// Test support for the c10d rendezvous tests: agents as threads over one MemoryStore (or
// TcpStore clients of one StoreServer, a restartable one too; the server's and clients' options
// are server_test_support.hpp's), options with short timeouts, and waits with bounds that only
// catch hangs.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <set>
#include <source_location>

#include "drun/common/deadline.hpp"
#include "drun/common/error.hpp"
#include "drun/rendezvous/c10d_rendezvous.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/store/memory_store.hpp"
#include "drun/store/store_server.hpp"
#include "drun/store/tcp_store.hpp"
#include "server_test_support.hpp"

namespace drun::rdzv::test {

using namespace std::chrono_literals;

inline constexpr auto kHang = 20s;  // upper bound that only catches hangs

inline RendezvousOptions options(int minNodes, int maxNodes, const std::string& runId = "job") {
  RendezvousOptions o;
  o.runId = runId;
  o.minNodes = minNodes;
  o.maxNodes = maxNodes;
  o.joinTimeout = 15s;
  o.lastCallTimeout = 300ms;
  o.heartbeatInterval = 100ms;
  o.heartbeatTimeout = 1s;
  o.readTimeout = 10s;
  o.replaceTimeout = 0ms;  // a loss below MIN fails at once, unless a test waits for replacements
  o.reconnectTimeout = 0ms;  // a refused store is gone at once, unless a test restarts one
  return o;
}

inline RendezvousOptions withNode(RendezvousOptions o, const std::string& addr, int localWorldSize = 1,
                           std::optional<int> nodeRank = std::nullopt) {
  o.localAddr = addr;
  o.localWorldSize = localWorldSize;
  o.nodeRank = nodeRank;
  return o;
}

// Agents on one MemoryStore: each gets its own handle (its own "connection" and will).
struct MemoryCluster {
  std::shared_ptr<MemoryStore::Shared> shared = MemoryStore::makeShared();
  MemoryStore observer{shared};

  std::unique_ptr<Rendezvous> agent(const RendezvousOptions& o, MemoryStore** handle = nullptr) {
    C10dStoreAccess access;
    auto store = std::make_unique<MemoryStore>(shared);
    if (handle) *handle = store.get();
    access.store = std::move(store);
    access.connectWatcher = [s = shared] { return std::make_unique<MemoryStore>(s); };
    access.endpoint = "memory";
    return makeC10dRendezvous(o, std::move(access));
  }
  LivenessStore& store() { return observer; }
};

// An agent whose store and membership watcher are TcpStore clients with `client`'s options.
inline std::unique_ptr<Rendezvous> tcpAgent(const RendezvousOptions& o, const TcpStoreOptions& client,
                                            TcpStore** handle = nullptr) {
  C10dStoreAccess access;
  auto store = std::make_unique<TcpStore>(client);
  if (handle) *handle = store.get();
  access.store = std::move(store);
  access.connectWatcher = [client] { return std::make_unique<TcpStore>(client); };
  access.endpoint = client.endpoint.toString();
  return makeC10dRendezvous(o, std::move(access));
}

// Agents as TcpStore clients of one StoreServer on a loopback port.
struct TcpCluster {
  StoreServer server{localOptions()};
  std::unique_ptr<TcpStore> observer;

  TcpCluster() {
    server.start();
    observer = std::make_unique<TcpStore>(clientOptions());
  }
  TcpStoreOptions clientOptions() const {
    TcpStoreOptions o = test::clientOptions(server.port());
    o.leaseTimeout = 1s;
    return o;
  }
  std::unique_ptr<Rendezvous> agent(const RendezvousOptions& o, TcpStore** handle = nullptr) {
    return tcpAgent(o, clientOptions(), handle);
  }
  LivenessStore& store() { return *observer; }
};

// Agents as TcpStore clients of a StoreServer that can be restarted, empty, on its port (a
// drun-rendezvous daemon restarted under a running job).
class RestartableStore {
 public:
  RestartableStore() { start(0); }

  void restartEmpty() {
    server_->stop();
    server_.reset();
    start(port_);
  }

  // An agent that waits up to 10 s for the store to come back.
  std::unique_ptr<Rendezvous> agent(RendezvousOptions o) {
    o.reconnectTimeout = 10s;
    TcpStoreOptions client = clientOptions(port_);
    client.connectTimeout = 2s;
    client.leaseTimeout = 1s;
    return tcpAgent(o, client);
  }

 private:
  void start(uint16_t port) {
    StoreServerOptions o = localOptions();
    o.listen.port = port;
    server_ = std::make_unique<StoreServer>(o);
    server_->start();
    port_ = server_->port();
  }

  std::unique_ptr<StoreServer> server_;
  uint16_t port_ = 0;
};

// Blocks until `count` agents have joined round `round` (the arrival counter), via watch.
inline void awaitArrivals(LivenessStore& store, const std::string& runId, uint64_t round, int64_t count) {
  const auto key = keys::count(runId, round);
  const Deadline deadline(kHang);
  std::optional<Bytes> value = store.tryGet(key);
  while (keys::parseCounter(value).value_or(0) < count) {
    REQUIRE_FALSE(deadline.expired());
    value = store.watch(key, value, deadline.remaining());
  }
}

inline std::future<RoundResult> startNext(Rendezvous& r) {
  return std::async(std::launch::async, [&r] { return r.next(); });
}

// A call that missed its bound cannot be abandoned: the future of std::async waits for it in its
// destructor, so a failed REQUIRE would unwind into a wait as long as the call's own timeout
// (CTest's 300 s). The binary ends here instead, naming the place, and CTest reports it failed.
template <typename T>
T getWithin(std::future<T>& f, std::chrono::milliseconds bound = kHang,
            std::source_location at = std::source_location::current()) {
  if (f.wait_for(bound) != std::future_status::ready) {
    std::fprintf(stderr, "%s:%u: FAILED: the call did not return within %lld ms (test: %s)\n",
                 at.file_name(), static_cast<unsigned>(at.line()), static_cast<long long>(bound.count()),
                 Catch::getResultCapture().getCurrentTestName().c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
  return f.get();
}

// The first job event reported to `agent` (whose "<kind>: <reason>" contains `needle`, if given).
// Declare it after the agent: its destructor unhooks the callback before the agent goes away.
class FirstChange {
 public:
  explicit FirstChange(Rendezvous& agent, std::string needle = {})
      : agent_(agent), needle_(std::move(needle)), future_(promise_.get_future()) {
    agent_.onJobEvent([this](const JobEvent& event) {
      const std::string text = std::string(toString(event.kind)) + ": " + event.reason;
      if (needle_.empty() || text.find(needle_) != std::string::npos)
        std::call_once(once_, [&] { promise_.set_value(text); });
    });
  }
  ~FirstChange() { agent_.onJobEvent(nullptr); }
  std::string get() {
    REQUIRE(future_.wait_for(kHang) == std::future_status::ready);
    return future_.get();
  }
  bool reportedWithin(std::chrono::milliseconds bound) {
    return future_.wait_for(bound) == std::future_status::ready;
  }

 private:
  Rendezvous& agent_;
  std::string needle_;
  std::promise<std::string> promise_;
  std::future<std::string> future_;
  std::once_flag once_;
};


// Global ranks 0..world-1 exactly once, consistent round fields, prefix sums.
inline void checkRound(const std::vector<RoundResult>& results, const std::vector<int>& localSizes) {
  REQUIRE(!results.empty());
  const auto& first = results.front();
  std::set<int> nodeRanks;
  std::multiset<int> globalRanks;
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    CHECK(r.round == first.round);
    CHECK(r.nodeCount == static_cast<int>(results.size()));
    CHECK(r.worldSize == first.worldSize);
    CHECK(r.masterAddr == first.masterAddr);
    CHECK(r.masterPort == first.masterPort);
    CHECK(r.masterPort != 0);
    CHECK(r.hosts == first.hosts);
    CHECK(r.storePrefix == first.storePrefix);
    nodeRanks.insert(r.nodeRank);
    for (int l = 0; l < localSizes[i]; ++l) globalRanks.insert(r.rankOffset + l);
  }
  CHECK(nodeRanks.size() == results.size());
  CHECK(*nodeRanks.rbegin() == static_cast<int>(results.size()) - 1);
  CHECK(static_cast<int>(globalRanks.size()) == first.worldSize);
  CHECK(std::set<int>(globalRanks.begin(), globalRanks.end()).size() == globalRanks.size());
  CHECK(*globalRanks.rbegin() == first.worldSize - 1);
  // Prefix sums in node-rank order.
  std::vector<std::pair<int, size_t>> byRank;
  for (size_t i = 0; i < results.size(); ++i) byRank.push_back({results[i].nodeRank, i});
  std::sort(byRank.begin(), byRank.end());
  int offset = 0;
  for (auto [rank, i] : byRank) {
    CHECK(results[i].rankOffset == offset);
    offset += localSizes[i];
  }
}

// hostA and hostB of a 2:2 job, round 0 formed.
inline std::pair<std::unique_ptr<Rendezvous>, std::unique_ptr<Rendezvous>> runningPair(
    MemoryCluster& cluster, int maxRestarts = 0) {
  RendezvousOptions o = options(2, 2);
  o.maxRestarts = maxRestarts;
  auto a = cluster.agent(withNode(o, "hostA"));
  auto b = cluster.agent(withNode(o, "hostB"));
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  checkRound({getWithin(fa), getWithin(fb)}, {1, 1});
  return {std::move(a), std::move(b)};
}

// One agent per host name on `cluster`, their first round formed (and checked).
inline std::vector<std::unique_ptr<Rendezvous>> formedJob(MemoryCluster& cluster,
                                                          const RendezvousOptions& o,
                                                          const std::vector<std::string>& hosts) {
  std::vector<std::unique_ptr<Rendezvous>> agents;
  for (const auto& host : hosts) agents.push_back(cluster.agent(withNode(o, host)));
  std::vector<std::future<RoundResult>> futures;
  for (auto& agent : agents) futures.push_back(startNext(*agent));
  std::vector<RoundResult> results;
  for (auto& f : futures) results.push_back(getWithin(f));
  checkRound(results, std::vector<int>(hosts.size(), 1));
  return agents;
}

// `victim` dies (its will runs) and `survivor` is told (MemberLost).
inline void loseMember(Rendezvous& survivor, std::unique_ptr<Rendezvous>& victim) {
  FirstChange lost(survivor, "member lost");
  victim.reset();
  lost.get();
}

// The keys of job `runId` besides its tombstone (`outcome` and `round`, kept once every node
// left so that a node coming back learns how the job ended): 0 when the job left nothing else.
inline int64_t keysBesidesTombstone(Store& store, const std::string& runId) {
  int64_t n = store.numKeys();
  if (store.tryGet(keys::outcome(runId))) n -= 1 + (store.tryGet(keys::currentRound(runId)) ? 1 : 0);
  return n;
}

}  // namespace drun::rdzv::test

// The interleaving tests' world: simulated nodes (an agent model per node, on its own thread,
// over one MemoryStore::Shared through HookStore connections), a journal of what each node did
// (rounds run, events, failures, endings, deaths) and the invariants checked on it.
//
// The agent model mirrors agent/src/elastic_agent.cpp's table: next() -> "running" until an
// event says stop (MemberLost, StoreLost, Failed; NodeWaiting after the last call timeout) ->
// next() again; a finish request calls finish() and waits in the exit barrier for Succeeded, then
// leave(); a failure request calls reportFailure(). Every wait has a deadline: a node that waits
// past it ends "stuck", which is itself a violation.
//
// Threading: one thread per node; the driver (the test) and the hook (any node's thread) use the
// Cluster's methods, which lock `mutex`. The hook is called with no Cluster lock held.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "drun/common/deadline.hpp"
#include "drun/rendezvous/c10d_rendezvous.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/store/store_server.hpp"
#include "hook_store.hpp"
#include "interleaving_backend.hpp"

namespace drun::rdzv::test {

using namespace std::chrono_literals;

// Under a sanitizer every thread runs several times slower and CI runs two such tests at once:
// a heartbeat thread starved past a 1 s timeout would be a false death, reported as a violation
// of the design rather than of the build. There every timeout and bound below is this much longer.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr int kTimeScale = 3;
#else
inline constexpr int kTimeScale = 1;
#endif

// Short timeouts: the whole enumeration must stay within about a minute.
inline RendezvousOptions shortOptions(int minNodes, int maxNodes, const std::string& runId) {
  RendezvousOptions o;
  o.runId = runId;
  o.minNodes = minNodes;
  o.maxNodes = maxNodes;
  o.joinTimeout = 3s * kTimeScale;
  o.lastCallTimeout = 100ms * kTimeScale;
  o.closeTimeout = 1s * kTimeScale;
  o.heartbeatInterval = 100ms * kTimeScale;
  o.heartbeatTimeout = 1s * kTimeScale;
  o.readTimeout = 2s * kTimeScale;
  o.reconnectTimeout = 0ms;  // a refused store is gone at once, unless a test restarts one
  o.maxRestarts = 3;         // the job's restart budget: a failing scenario restarts within it
  return o;
}

constexpr auto kStuck = 6s * kTimeScale;       // a node waiting this long for anything is stuck
constexpr auto kTellBound = 5s * kTimeScale;   // survivors learn of a dead member within this
constexpr auto kFenceBound = 1s * kTimeScale;  // a cut-off node stops its workers within this (heartbeat)

enum class Phase { Idle, Joining, Running, Finishing, Ended };
enum class Ending { None, Succeeded, JobEnded, Failed, Error, Dead, Stuck };

inline const char* toString(Ending e) {
  switch (e) {
    case Ending::None: return "none";
    case Ending::Succeeded: return "succeeded";
    case Ending::JobEnded: return "job ended while waiting";
    case Ending::Failed: return "failed";
    case Ending::Error: return "rendezvous error";
    case Ending::Dead: return "dead";
    case Ending::Stuck: return "stuck";
  }
  return "?";
}

// A round as one node ran it: from next() returning until the node stopped its "workers".
struct Interval {
  std::string node;
  RoundResult result;
  Clock::time_point start;
  Clock::time_point end = Clock::time_point::max();
};

// A root cause as one node learned it (reportFailure's result, or a Failed event).
struct CauseSeen {
  std::string node;
  uint64_t round = 0;
  FailureRecord cause;
};

class Cluster;

class Node {
 public:
  Node(Cluster& cluster, std::string name, RendezvousOptions options);
  ~Node();

  const std::string& name() const { return name_; }
  NodeLink& link() { return *link_; }

  // Driver commands (any thread).
  void start();
  void requestFinish();
  void requestFailure(int exitCode = 3);  // within the options' budget (maxRestarts)

  // How long this node's workers take to stop before it joins again (set before start()).
  milliseconds stopTime{0};

  // Read under Cluster::mutex.
  Phase phase = Phase::Idle;
  uint64_t round = 0;
  Ending ending = Ending::None;
  int exitCode = 0;
  std::string endText;
  std::vector<JobEvent> seenEvents;  // every event delivered, in order
  bool finishReturned = false;       // finish() returned (the node waits in the exit barrier)

 private:
  friend class Cluster;
  void run();
  void leaveQuietly();
  bool runRound(const RoundResult& r);  // true: join again
  bool barrier(const RoundResult& r);
  template <typename More>
  bool awaitNews(std::unique_lock<std::mutex>& lock, const RoundResult& r, Clock::time_point until,
                 std::vector<JobEvent>& events, More more);
  void end(Ending how, int code, const std::string& text);
  template <typename F>
  auto call(const char* what, F&& f);

  Cluster& cluster_;
  const std::string name_;
  const RendezvousOptions options_;
  std::shared_ptr<NodeLink> link_;
  std::unique_ptr<Rendezvous> rdzv_;
  std::thread thread_;
  // Under Cluster::mutex:
  std::vector<JobEvent> pending_;
  bool finishRequested_ = false;
  bool failRequested_ = false;
  int failCode_ = 3;
};

class Cluster {
 public:
  // `shared`: the store of an earlier cluster (the same id started again), else a fresh one.
  explicit Cluster(std::string runId, std::shared_ptr<MemoryStore::Shared> store = nullptr)
      : runId(std::move(runId)),
        shared(store ? std::move(store) : MemoryStore::makeShared()),
        backend(std::make_shared<MemoryBackend>(shared)) {}
  // The nodes' store on another backend (EtcdBackend); `shared` is then unused.
  Cluster(std::string runId, std::shared_ptr<StoreBackend> storeBackend)
      : runId(std::move(runId)), shared(MemoryStore::makeShared()), backend(std::move(storeBackend)) {}
  ~Cluster() { stopAll(); }

  const std::string runId;
  const Clock::time_point created = Clock::now();
  std::shared_ptr<MemoryStore::Shared> shared;
  MemoryStore observer{shared};  // reads the MemoryBackend's store (tests on it only)
  const std::shared_ptr<StoreBackend> backend;
  NodeLink::Hook hook;  // set before nodes are added

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::unique_ptr<Node>> nodes;
  std::vector<Interval> intervals;
  std::vector<CauseSeen> causes;
  std::vector<std::pair<std::string, Clock::time_point>> deaths;
  std::vector<std::pair<std::string, Clock::time_point>> cuts;
  // Per cut: the last round the node can hold a seat of that it took (or was taking) before the
  // cut: the round it ran, or the next while it was joining. Its interval of such a round may
  // begin a moment after the cut (next() had returned; the model records the start later).
  std::vector<uint64_t> cutRoundLimits;
  std::vector<std::string> notes;  // what the driver or an injection did, for messages

  Node& add(const std::string& name, RendezvousOptions options) {
    options.localAddr = name;
    // Built outside `mutex`: the node's event callback takes it under the rendezvous' own lock.
    auto node = std::make_unique<Node>(*this, name, std::move(options));
    std::lock_guard lock(mutex);
    nodes.push_back(std::move(node));
    return *nodes.back();
  }
  Node& node(const std::string& name) {
    std::lock_guard lock(mutex);
    return nodeLocked(name);
  }
  Node& nodeLocked(const std::string& name) {
    for (auto& n : nodes)
      if (n->name() == name) return *n;
    throw std::logic_error("no node " + name);
  }
  void notify() {
    { std::lock_guard lock(mutex); }
    changed.notify_all();
  }
  void note(const std::string& text) {
    std::lock_guard lock(mutex);
    noteLocked(text);
  }
  void noteLocked(const std::string& text) {
    notes.push_back(
        std::to_string(std::chrono::duration_cast<milliseconds>(Clock::now() - created).count()) +
        "ms " + text);
  }

  // Waits until pred() (called under `mutex`) holds; false at the deadline.
  template <typename Pred>
  bool waitFor(milliseconds bound, Pred pred) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, bound, pred);
  }

  // The node's agent (its rendezvous and its workers) dies: every connection closes (wills run),
  // reconnects are refused, and its running round ends now.
  void kill(const std::string& name) {
    Node& n = node(name);
    {
      std::lock_guard lock(mutex);
      deaths.push_back({name, Clock::now()});
      noteLocked("killed " + name);
      closeIntervalLocked(name);
    }
    n.link().dropAll(true);
    notify();
  }

  // The node's link is cut for a moment: every connection closes (wills run, blocked calls end)
  // but the node may connect again; it runs on until it notices (its watcher: StoreLost).
  void cut(const std::string& name) {
    Node& n = node(name);
    {
      std::lock_guard lock(mutex);
      cuts.push_back({name, Clock::now()});
      cutRoundLimits.push_back(n.phase == Phase::Running ? n.round : n.round + 1);
      noteLocked("cut " + name + "'s link");
    }
    n.link().dropAll(false);
    notify();
  }

  // Starts `name` and waits until it blocks in its join's watch, or formed a round, or ended.
  bool arrive(const std::string& name, milliseconds bound = 3s * kTimeScale) {
    Node& n = node(name);
    note(name + " arrives");
    n.start();
    return waitFor(bound, [&] {
      return n.phase == Phase::Running || n.phase == Phase::Ended ||
             (n.phase == Phase::Joining && n.link().blockedInWatch());
    });
  }

  // Waits until the named nodes run one round together (and returns it), or nullopt.
  std::optional<uint64_t> awaitRunning(const std::vector<std::string>& names,
                                       milliseconds bound = 5s * kTimeScale) {
    std::optional<uint64_t> common;
    waitFor(bound, [&] {
      common.reset();
      for (auto& name : names) {
        Node& n = nodeLocked(name);
        if (n.phase != Phase::Running || (common && *common != n.round)) return false;
        common = n.round;
      }
      return true;
    });
    return common;
  }

  // Waits until nothing moves: every live node runs (all in one round) or waits blocked in a
  // join (a spare, a late node), and nobody is mid-call. False at the bound.
  bool settle(milliseconds bound = 5s * kTimeScale) {
    return waitFor(bound, [&] {
      std::optional<uint64_t> common;
      bool anyRunning = false;
      for (auto& n : nodes) {
        if (n->phase == Phase::Idle || n->phase == Phase::Ended) continue;
        if (n->phase == Phase::Joining) {
          if (!n->link().blockedInWatch()) return false;
          continue;
        }
        if (n->phase != Phase::Running || (common && *common != n->round)) return false;
        common = n->round;
        anyRunning = true;
      }
      // Every node ended: nothing more will move either.
      return anyRunning || std::all_of(nodes.begin(), nodes.end(), [](auto& n) {
               return n->phase == Phase::Ended || n->phase == Phase::Idle;
             });
    });
  }

  // Every started node's workers succeed (now, or as soon as it runs a round); waits until every
  // node ended. False at the bound.
  bool finishAll(milliseconds bound = 12s * kTimeScale) {
    {
      std::lock_guard lock(mutex);
      for (auto& n : nodes) n->finishRequested_ = true;
    }
    notify();
    return waitFor(bound, [&] {
      return std::all_of(nodes.begin(), nodes.end(), [](auto& n) {
        return n->phase == Phase::Idle || n->phase == Phase::Ended;
      });
    });
  }

  void stopAll() {
    // A node still waiting is stuck; ending it for good lets its thread return.
    std::vector<Node*> all;
    {
      std::lock_guard lock(mutex);
      for (auto& n : nodes) all.push_back(n.get());
    }
    for (Node* n : all)
      if (n->phase != Phase::Idle && n->phase != Phase::Ended) n->link().dropAll(true);
    notify();
    for (Node* n : all)
      if (n->thread_.joinable()) n->thread_.join();
  }

  void closeIntervalLocked(const std::string& name) {
    for (auto& i : intervals)
      if (i.node == name && i.end == Clock::time_point::max()) i.end = Clock::now();
  }

  // The invariants over the journal; returns the violations (empty: all hold).
  std::vector<std::string> violations();
  std::string journalText();
};

}  // namespace drun::rdzv::test

#include "interleaving_agent_model.hpp"
#include "interleaving_invariants.hpp"

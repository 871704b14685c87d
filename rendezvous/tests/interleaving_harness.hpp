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
#include "drun/rendezvous/store_server.hpp"
#include "hook_store.hpp"

namespace drun::rdzv::test {

using namespace std::chrono_literals;

// Short timeouts: the whole enumeration must stay within about a minute.
inline RendezvousOptions shortOptions(int minNodes, int maxNodes, const std::string& runId) {
  RendezvousOptions o;
  o.runId = runId;
  o.minNodes = minNodes;
  o.maxNodes = maxNodes;
  o.joinTimeout = 3s;
  o.lastCallTimeout = 100ms;
  o.closeTimeout = 1s;
  o.heartbeatInterval = 100ms;
  o.heartbeatTimeout = 1s;
  o.readTimeout = 2s;
  return o;
}

constexpr auto kStuck = 6s;        // a node waiting this long for anything is stuck
constexpr auto kTellBound = 5s;    // survivors learn of a dead member within this

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
  void requestFailure(int maxRestarts, int exitCode = 3);

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
  std::optional<int> failRequested_;  // max restarts
  int failCode_ = 3;
};

class Cluster {
 public:
  // `shared`: the store of an earlier cluster (the same id started again), else a fresh one.
  explicit Cluster(std::string runId, std::shared_ptr<MemoryStore::Shared> store = nullptr)
      : runId(std::move(runId)), shared(store ? std::move(store) : MemoryStore::makeShared()) {}
  ~Cluster() { stopAll(); }

  const std::string runId;
  const Clock::time_point created = Clock::now();
  std::shared_ptr<MemoryStore::Shared> shared;
  MemoryStore observer{shared};
  NodeLink::Hook hook;  // set before nodes are added

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::unique_ptr<Node>> nodes;
  std::vector<Interval> intervals;
  std::vector<CauseSeen> causes;
  std::vector<std::pair<std::string, Clock::time_point>> deaths;
  std::vector<std::string> notes;  // what the driver or an injection did, for messages

  Node& add(const std::string& name, RendezvousOptions options) {
    options.localAddr = name;
    std::lock_guard lock(mutex);
    nodes.push_back(std::make_unique<Node>(*this, name, std::move(options)));
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

  // Starts `name` and waits until it blocks in its join's watch, or formed a round, or ended.
  bool arrive(const std::string& name, milliseconds bound = 3s) {
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
                                       milliseconds bound = 5s) {
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
  bool settle(milliseconds bound = 5s) {
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
  bool finishAll(milliseconds bound = 12s) {
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

// ---- Node ----

inline Node::Node(Cluster& cluster, std::string name, RendezvousOptions options)
    : cluster_(cluster), name_(std::move(name)), options_(std::move(options)) {
  link_ = std::make_shared<NodeLink>(name_, cluster_.hook, [&c = cluster_] { c.notify(); });
  C10dStoreAccess access;
  access.store = std::make_unique<HookStore>(link_, std::make_unique<MemoryStore>(cluster_.shared));
  access.connectWatcher = [link = link_, shared = cluster_.shared]() -> std::unique_ptr<Store> {
    return std::make_unique<HookStore>(link, std::make_unique<MemoryStore>(shared));
  };
  access.endpoint = "memory";
  rdzv_ = makeC10dRendezvous(options_, std::move(access));
  rdzv_->onJobEvent([this](const JobEvent& e) {
    {
      std::lock_guard lock(cluster_.mutex);
      pending_.push_back(e);
      seenEvents.push_back(e);
    }
    cluster_.changed.notify_all();
  });
}

inline Node::~Node() {
  if (thread_.joinable()) thread_.join();
}

inline void Node::start() {
  {
    std::lock_guard lock(cluster_.mutex);
    phase = Phase::Joining;
  }
  thread_ = std::thread([this] { run(); });
}

inline void Node::requestFinish() {
  {
    std::lock_guard lock(cluster_.mutex);
    finishRequested_ = true;
  }
  cluster_.notify();
}

inline void Node::requestFailure(int maxRestarts, int exitCode) {
  {
    std::lock_guard lock(cluster_.mutex);
    failRequested_ = maxRestarts;
    failCode_ = exitCode;
  }
  cluster_.notify();
}

template <typename F>
auto Node::call(const char* what, F&& f) {
  link_->beginCall(what);
  struct End {
    NodeLink& link;
    ~End() { link.endCall(); }
  } endCall{*link_};
  return f();
}

inline void Node::end(Ending how, int code, const std::string& text) {
  {
    std::lock_guard lock(cluster_.mutex);
    if (link_->refused()) how = Ending::Dead;  // whatever it saw, it was killed
    cluster_.closeIntervalLocked(name_);
    cluster_.noteLocked(name_ + " ended " + toString(how));
    ending = how;
    exitCode = code;
    endText = text;
    phase = Phase::Ended;
  }
  cluster_.notify();
}

inline void Node::run() {
  for (;;) {
    RoundResult r;
    try {
      r = call("join", [&] { return rdzv_->next(); });
    } catch (const JobEnded& e) {
      end(Ending::JobEnded, e.exitCode(), e.what());
      break;
    } catch (const std::exception& e) {
      end(Ending::Error, 1, e.what());
      break;
    }
    {
      std::lock_guard lock(cluster_.mutex);
      if (!link_->refused()) {
        cluster_.intervals.push_back({name_, r, Clock::now()});
        phase = Phase::Running;
        round = r.round;
      }
    }
    cluster_.notify();
    if (link_->refused()) {
      end(Ending::Dead, 137, "killed");
      break;
    }
    if (!runRound(r)) break;
    // Stopping the workers takes a while (SIGTERM, grace): they run until then.
    std::unique_lock lock(cluster_.mutex);
    cluster_.changed.wait_for(lock, stopTime, [&] { return link_->refused(); });
    cluster_.closeIntervalLocked(name_);
    phase = Phase::Joining;
  }
  // The agent exits: the rendezvous goes (its will runs unless it left).
  rdzv_->onJobEvent(nullptr);
  rdzv_.reset();
}

// Waits (under `lock`) until this node is killed, an event of round r or later arrives, more()
// holds or `until`; takes the events. Returns false when the node was killed (it has ended).
template <typename More>
bool Node::awaitNews(std::unique_lock<std::mutex>& lock, const RoundResult& r,
                     Clock::time_point until, std::vector<JobEvent>& events, More more) {
  cluster_.changed.wait_until(lock, until,
                              [&] { return link_->refused() || !pending_.empty() || more(); });
  if (link_->refused()) {
    lock.unlock();
    end(Ending::Dead, 137, "killed");
    return false;
  }
  events = std::move(pending_);
  pending_.clear();
  std::erase_if(events, [&](const JobEvent& e) { return e.round < r.round; });  // old news
  return true;
}

// Runs round r until something stops it. Returns true to join again.
inline bool Node::runRound(const RoundResult& r) {
  const Deadline stuck(kStuck);
  Clock::time_point scaleUpAt = Clock::time_point::max();
  for (;;) {
    std::unique_lock lock(cluster_.mutex);
    std::vector<JobEvent> events;
    if (!awaitNews(lock, r, std::min(scaleUpAt, stuck.when()), events, [&] {
          return finishRequested_ || failRequested_ || Clock::now() >= scaleUpAt;
        }))
      return false;
    for (const JobEvent& e : events) {
      switch (e.kind) {
        case JobEvent::Kind::Failed:
          cluster_.causes.push_back({name_, e.round, *e.failure});
          if (e.failure->final) {
            lock.unlock();
            call("leave", [&] { rdzv_->leave(); });
            end(Ending::Failed, e.failure->statusCode(), "the job failed");
            return false;
          }
          return true;
        case JobEvent::Kind::MemberLost:
        case JobEvent::Kind::StoreLost:
          return true;
        case JobEvent::Kind::NodeWaiting:
          if (scaleUpAt == Clock::time_point::max())
            scaleUpAt = Clock::now() + options_.lastCallTimeout;
          break;
        case JobEvent::Kind::Succeeded: break;  // not before this node finished
      }
    }
    if (Clock::now() >= scaleUpAt) return true;
    if (failRequested_) {
      const int maxRestarts = *failRequested_;
      failRequested_.reset();
      cluster_.closeIntervalLocked(name_);
      lock.unlock();
      FailureRecord mine;
      mine.rank = r.rankOffset;
      mine.exitCode = failCode_;
      FailureRecord cause;
      try {
        cause = call("report", [&] { return rdzv_->reportFailure(mine, maxRestarts); });
      } catch (const std::exception& e) {
        end(Ending::Error, 1, std::string("reportFailure: ") + e.what());
        return false;
      }
      {
        std::lock_guard relock(cluster_.mutex);
        cluster_.causes.push_back({name_, r.round, cause});
      }
      if (!cause.final) return true;
      call("leave", [&] { rdzv_->leave(); });
      end(Ending::Failed, cause.statusCode(), "the job failed");
      return false;
    }
    if (finishRequested_) {
      cluster_.closeIntervalLocked(name_);
      phase = Phase::Finishing;
      lock.unlock();
      cluster_.notify();
      try {
        call("finish", [&] { rdzv_->finish(); });
      } catch (const std::exception& e) {
        end(Ending::Error, 1, std::string("finish: ") + e.what());
        return false;
      }
      {
        std::lock_guard relock(cluster_.mutex);
        finishReturned = true;
      }
      cluster_.notify();
      return barrier(r);
    }
    if (stuck.expired()) {
      lock.unlock();
      end(Ending::Stuck, 1, "ran round " + std::to_string(r.round) + " for " +
                                std::to_string(kStuck.count()) + " s with no event");
      return false;
    }
  }
}

// The exit barrier after finish(): Succeeded ends the node; a loss or failure re-forms.
inline bool Node::barrier(const RoundResult& r) {
  const Deadline stuck(kStuck);
  for (;;) {
    std::unique_lock lock(cluster_.mutex);
    std::vector<JobEvent> events;
    if (!awaitNews(lock, r, stuck.when(), events, [] { return false; })) return false;
    for (const JobEvent& e : events) {
      if (e.kind == JobEvent::Kind::NodeWaiting) continue;
      if (e.kind == JobEvent::Kind::Failed) cluster_.causes.push_back({name_, e.round, *e.failure});
      lock.unlock();
      if (e.kind == JobEvent::Kind::Succeeded) {
        call("leave", [&] { rdzv_->leave(); });
        end(Ending::Succeeded, 0, "");
        return false;
      }
      if (e.kind == JobEvent::Kind::Failed && e.failure->final) {
        call("leave", [&] { rdzv_->leave(); });
        end(Ending::Failed, e.failure->statusCode(), "the job failed");
        return false;
      }
      return true;  // MemberLost, StoreLost, a failure with budget left: re-form
    }
    if (stuck.expired()) {
      lock.unlock();
      end(Ending::Stuck, 1, "waited " + std::to_string(kStuck.count()) +
                                " s in the exit barrier of round " + std::to_string(r.round));
      return false;
    }
  }
}

// ---- the invariants ----

inline bool overlaps(const Interval& a, const Interval& b) {
  return a.start < b.end && b.start < a.end;
}

inline bool isMember(const Interval& i, const std::string& node) {
  return std::find(i.result.hosts.begin(), i.result.hosts.end(), node) != i.result.hosts.end();
}

inline std::string describe(const Interval& i, Clock::time_point t0) {
  auto at = [&](Clock::time_point t) {
    if (t == Clock::time_point::max()) return std::string("open");
    return std::to_string(std::chrono::duration_cast<milliseconds>(t - t0).count()) + "ms";
  };
  std::string hosts;
  for (auto& h : i.result.hosts) hosts += (hosts.empty() ? "" : ",") + h;
  return i.node + " round " + std::to_string(i.result.round) + " rank " +
         std::to_string(i.result.nodeRank) + "/" + std::to_string(i.result.nodeCount) + " [" +
         hosts + "] master " + i.result.masterAddr + ":" + std::to_string(i.result.masterPort) +
         " restarts " + std::to_string(i.result.restartCount) + " " + at(i.start) + ".." +
         at(i.end);
}

inline std::vector<std::string> Cluster::violations() {
  std::lock_guard lock(mutex);
  std::vector<std::string> out;
  const auto t0 = created;
  auto isDead = [&](const std::string& name) {
    return std::any_of(deaths.begin(), deaths.end(), [&](auto& d) { return d.first == name; });
  };
  // Every node ends, none stuck.
  for (auto& n : nodes) {
    if (n->phase == Phase::Idle) continue;
    if (n->phase != Phase::Ended)
      out.push_back(n->name() + " never ended (still " +
                    (n->phase == Phase::Joining ? "joining" : "running or finishing") + ")");
    else if (n->ending == Ending::Stuck)
      out.push_back(n->name() + " stuck: " + n->endText);
  }
  // (a) At most one round runs workers at a time: never two rank-0 groups of different rounds
  // at once, and no node counted in a round while it runs another.
  for (size_t i = 0; i < intervals.size(); ++i)
    for (size_t j = i + 1; j < intervals.size(); ++j) {
      const Interval& a = intervals[i];
      const Interval& b = intervals[j];
      if (a.result.round == b.result.round || !overlaps(a, b)) continue;
      if (a.result.nodeRank == 0 && b.result.nodeRank == 0)
        out.push_back("two rank-0 groups at once (split brain): " + describe(a, t0) + " AND " +
                      describe(b, t0));
      else if (isMember(b, a.node) || isMember(a, b.node))
        out.push_back("a node in two rounds' groups at once: " + describe(a, t0) + " AND " +
                      describe(b, t0));
    }
  // (b) A dead member's survivors stop within kTellBound (a MemberLost or Failed reached them).
  for (auto& [dead, at] : deaths)
    for (const Interval& i : intervals) {
      if (i.node == dead || !isMember(i, dead) || i.end <= at) continue;
      if (i.end - std::max(at, i.start) > kTellBound)
        out.push_back("round ran with dead member " + dead + " (killed at " +
                      std::to_string(std::chrono::duration_cast<milliseconds>(at - t0).count()) +
                      "ms) and " + i.node + " was not told: " + describe(i, t0));
    }
  // (c) A succeeded job: every live node succeeded, or (never a member) ended with code 0.
  const bool succeeded = std::any_of(nodes.begin(), nodes.end(),
                                     [](auto& n) { return n->ending == Ending::Succeeded; });
  if (succeeded)
    for (auto& n : nodes) {
      if (n->phase != Phase::Ended || isDead(n->name()) || n->ending == Ending::Succeeded) continue;
      if (n->ending == Ending::JobEnded && n->exitCode == 0) continue;
      out.push_back("the job succeeded but " + n->name() + " ended " + toString(n->ending) +
                    " (code " + std::to_string(n->exitCode) + "): " + n->endText);
    }
  // (e) One restart count per round, one root cause per round.
  for (const Interval& a : intervals)
    for (const Interval& b : intervals)
      if (a.result.round == b.result.round && a.result.restartCount != b.result.restartCount &&
          &a < &b)
        out.push_back("two restart counts in one round: " + describe(a, t0) + " AND " +
                      describe(b, t0));
  for (const CauseSeen& a : causes)
    for (const CauseSeen& b : causes)
      if (&a < &b && a.round == b.round &&
          (a.cause.node != b.cause.node || a.cause.rank != b.cause.rank ||
           a.cause.statusCode() != b.cause.statusCode()))
        out.push_back("two root causes in round " + std::to_string(a.round) + ": " + a.node +
                      " has rank " + std::to_string(a.cause.rank) + " on " + a.cause.node + ", " +
                      b.node + " has rank " + std::to_string(b.cause.rank) + " on " + b.cause.node);
  return out;
}

inline std::string Cluster::journalText() {
  std::lock_guard lock(mutex);
  std::ostringstream os;
  os << "journal of job '" << runId << "':\n";
  for (auto& n : notes) os << "  did: " << n << "\n";
  for (auto& i : intervals) os << "  ran: " << describe(i, created) << "\n";
  for (auto& n : nodes) {
    os << "  node " << n->name() << ": " << toString(n->ending) << " (code " << n->exitCode
       << ") " << n->endText << "; events:";
    for (auto& e : n->seenEvents) os << " " << rdzv::toString(e.kind) << "@" << e.round;
    os << "\n";
  }
  return os.str();
}

}  // namespace drun::rdzv::test

// Deterministic interleavings of the c10d rendezvous: each scenario
// runs once with a counting hook to learn the store operations of the calls under test, then once
// per operation with an injection right before it (a member's will fires, a newcomer arrives),
// each run on a fresh MemoryStore::Shared and run id. The journal of every run is checked against
// the invariants (interleaving_harness.hpp): one round runs workers at a time, a dead member's
// survivors are told, a succeeded job ends succeeded everywhere, one root cause and one restart
// count. The store host's exit barrier (invariant (d)) is not expressible over MemoryStore (no
// node hosts a server there): the agent-level and chaos tests cover it.
// Every scenario runs twice: over MemoryStore, and over a real etcd cluster through EtcdStore
// ("interleavings over etcd: ...", interleaving_backend.hpp).
//
// Tagged [v2] where a point covers a known defect of the elastic core (see docs/interleavings.md).
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <catch2/catch.hpp>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "interleaving_harness.hpp"
#include <spdlog/spdlog.h>

using namespace drun;
using namespace drun::rdzv;
using namespace drun::rdzv::test;

namespace {

enum class Backend { Memory, Etcd };

// A call of one node whose store operations are enumerated.
struct Target {
  std::string node;
  std::string call;
  int occurrence = 1;
};

struct Scenario {
  std::string name;
  std::function<void(Cluster&, const std::string& runId)> setup;  // adds the nodes
  std::function<void(Cluster&)> drive;                            // runs the job to its end
  std::vector<Target> targets;
  std::function<void(Cluster&, const StoreOp&)> inject;
};

// A point: before the nth operation `name` on `key` (run id and node ids left out) of a target
// call. Named so rather than by index, it stays the same point when a run's join loop turns once
// more or less before it.
struct Point {
  Target target;
  std::string name;
  std::string key;
  int nth = 0;
  std::string op;  // as the counting pass saw it
};

// The key without what differs from run to run: the run id and node ids.
std::string stableKey(const StoreOp& op, const std::string& runId) {
  std::string key = op.key;
  const std::string job = "rdzv/" + runId + "/";
  if (key.rfind(job, 0) == 0) key = "rdzv/<id>/" + key.substr(job.size());
  for (const char* named : {"/assign/", "/dead/", "/reeval/"})
    if (auto at = key.find(named); at != std::string::npos)
      key = key.substr(0, at + std::strlen(named)) + "*";
  return key;
}

// Counts the operations of each target call by (name, stable key): the nth of each.
class OpCounter {
 public:
  int count(const StoreOp& op, const std::string& runId) {
    std::lock_guard lock(mutex_);
    return ++counts_[op.node + "\t" + op.call + "\t" + std::to_string(op.occurrence) + "\t" +
                     op.name + "\t" + stableKey(op, runId)];
  }

 private:
  std::mutex mutex_;
  std::map<std::string, int> counts_;
};

struct RunResult {
  std::vector<std::string> violations;
  std::string journal;
  bool fired = false;
};

// Runs the scenario once; with `at`, the injection runs before that point; with `seen`, every
// operation of a target call is recorded as a point.
RunResult runOnce(const Scenario& s, Backend backend, const std::string& runId, const Point* at,
                  std::vector<Point>* seen) {
  OpCounter counter;  // (declared before the cluster, whose hook uses them)
  std::mutex seenMutex;
  std::atomic<bool> fired{false};
  auto made = backend == Backend::Memory ? std::make_unique<Cluster>(runId)
                                         : std::make_unique<Cluster>(runId, std::make_shared<EtcdBackend>());
  Cluster& cluster = *made;
  cluster.hook = [&](const StoreOp& op) {
    const Target* target = nullptr;
    for (const Target& t : s.targets)
      if (op.node == t.node && op.call == t.call && op.occurrence == t.occurrence) target = &t;
    if (!target) return;
    const int nth = counter.count(op, runId);
    if (seen) {
      std::lock_guard lock(seenMutex);
      seen->push_back({*target, op.name, stableKey(op, runId), nth, op.describe()});
    }
    if (!at || op.node != at->target.node || op.call != at->target.call ||
        op.occurrence != at->target.occurrence || op.name != at->name ||
        stableKey(op, runId) != at->key || nth != at->nth || fired.exchange(true))
      return;
    cluster.note("injection before " + op.describe());
    s.inject(cluster, op);
  };
  s.setup(cluster, runId);
  s.drive(cluster);
  RunResult r;
  r.violations = cluster.violations();
  if (backend == Backend::Memory) {
    // Every node has left or died: `present` ends at 0 (or is gone with the job's keys). Below:
    // a node counted out twice (its will and its leave, or two wills) makes the last node out
    // remove the job's keys while another still waits (the exit barrier's "n1 stuck"). Above: a
    // node counted in twice, or never out (cut off between counting itself in and setting its
    // will); the keys outlive the job and a new start with the same id waits close_timeout for a
    // phantom node.
    cluster.stopAll();
    const auto present = cluster.observer.tryGet(keys::present(runId));
    const int64_t left = keys::parseCounter(present).value_or(0);
    if (left < 0)
      r.violations.push_back("the job's `present` count ended at " + *present +
                             ": a node was counted out of the job twice");
    if (left > 0)
      r.violations.push_back("the job's `present` count ended at " + *present +
                             " with every node gone: a node was counted in twice, or never out");
  }
  r.fired = fired.load();
  r.journal = cluster.journalText();
  cluster.stopAll();
  return r;
}

// Runs the scenario once per store operation of its targets; every violation is a test failure
// naming the scenario and the point.
void enumerate(const Scenario& s, Backend backend) {
  const auto t0 = Clock::now();
  std::vector<Point> points;
  // DRUN_INTERLEAVING_POINT=k runs point k only, with the rendezvous' debug log: to study one.
  const char* only = std::getenv("DRUN_INTERLEAVING_POINT");
  if (only) spdlog::set_level(spdlog::level::debug);
  RunResult plain = runOnce(s, backend, "count", nullptr, &points);
  for (auto& v : plain.violations)
    FAIL_CHECK("scenario '" << s.name << "' without injection: " << v << "\n" << plain.journal);
  REQUIRE(!points.empty());
  // The points run a few at a time (each on its own store and run id): most of a run is waiting.
  std::vector<RunResult> results(points.size());
  // Over etcd 2: every point is rounds of real etcd requests (three members, fsyncs), and four
  // at a time on a loaded 2-core machine starve the rendezvous' own deadlines.
  const size_t jobs = std::getenv("DRUN_INTERLEAVING_JOBS")
                          ? std::max(1, std::atoi(std::getenv("DRUN_INTERLEAVING_JOBS")))
                          : (backend == Backend::Memory ? 4 : 2);
  std::atomic<size_t> nextPoint{0};
  std::vector<std::thread> workers;
  for (size_t w = 0; w < std::min(jobs, points.size()); ++w)
    workers.emplace_back([&] {
      for (size_t k; (k = nextPoint++) < points.size();) {
        if (only && std::to_string(k) != only) continue;
        try {  // no exception may end a thread (std::terminate): a run that threw fails its point
          results[k] = runOnce(s, backend, "k" + std::to_string(k), &points[k], nullptr);
        } catch (const std::exception& e) {
          results[k].fired = true;
          results[k].violations.push_back(std::string("the run threw: ") + e.what());
        }
      }
    });
  for (auto& w : workers) w.join();
  int failing = 0, unreached = 0;
  for (size_t k = 0; k < points.size(); ++k) {
    const Point& p = points[k];
    const RunResult& r = results[k];
    if (!r.fired) ++unreached;  // this run took another path before the point: still checked
    if (std::getenv("DRUN_INTERLEAVING_JOURNAL")) WARN("k=" << k << " " << r.journal);
    if (r.violations.empty()) continue;
    ++failing;
    std::string all;
    for (auto& v : r.violations) all += "\n  - " + v;
    // The first failing points carry the whole journal; the others their violations only.
    FAIL_CHECK("scenario '" << s.name << "', point k=" << k << " (before " << p.op
                            << "): " << r.violations.size() << " violation(s):" << all
                            << (failing <= 2 ? "\n" + r.journal : std::string()));
  }
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
  WARN("scenario '" << s.name << "': " << points.size() << " points, " << failing
                    << " failing, " << unreached << " not reached, " << took.count() << " ms");
}

std::string nodeName(int i) { return "n" + std::to_string(i); }

// n nodes of --nnodes min:max, named n0..n<n-1>.
std::function<void(Cluster&, const std::string&)> nodes(int n, int minNodes, int maxNodes) {
  return [=](Cluster& c, const std::string& runId) {
    for (int i = 0; i < n; ++i) c.add(nodeName(i), shortOptions(minNodes, maxNodes, runId));
  };
}

// Starts the first `count` nodes one after the other (each blocked in its join, or running,
// before the next starts), so that the last one closes the round.
void arriveInOrder(Cluster& c, int count) {
  for (int i = 0; i < count; ++i) c.arrive(nodeName(i));
}

// Injections: `victim` dies, or its link is cut.
std::function<void(Cluster&, const StoreOp&)> killing(std::string victim) {
  return [victim](Cluster& c, const StoreOp&) { c.kill(victim); };
}
std::function<void(Cluster&, const StoreOp&)> cutting(std::string victim) {
  return [victim](Cluster& c, const StoreOp&) { c.cut(victim); };
}

// The first `count` nodes form the job, which then runs until every node finishes.
std::function<void(Cluster&)> formAndFinish(int count) {
  return [count](Cluster& c) {
    arriveInOrder(c, count);
    c.settle();
    c.finishAll();
  };
}

// The first `count` nodes form the job; `first` finishes before the others (it waits in the
// exit barrier), optionally after `before` did.
std::function<void(Cluster&)> finishFirst(int count, std::string first, std::string before = {}) {
  return [=](Cluster& c) {
    arriveInOrder(c, count);
    std::vector<std::string> all;
    for (int i = 0; i < count; ++i) all.push_back(nodeName(i));
    c.awaitRunning(all);
    for (const std::string& name : {before, first}) {
      if (name.empty()) continue;
      c.node(name).requestFinish();
      c.waitFor(3s * kTimeScale, [&] {
        auto& n = c.nodeLocked(name);
        return n.finishReturned || n.phase == Phase::Ended;
      });
    }
    c.finishAll();
  };
}

// `count` nodes of --nnodes min:count form the job and finish; n0's link is cut at each point
// of `joiner`'s join.
Scenario cutWhileJoining(std::string name, int count, int minNodes, std::string joiner) {
  Scenario s;
  s.name = std::move(name);
  s.setup = nodes(count, minNodes, count);
  s.drive = formAndFinish(count);
  s.targets = {{std::move(joiner), "join"}};
  s.inject = cutting("n0");
  return s;
}

// Three nodes form the job, n0's workers fail (budget 3: shortOptions), the job re-forms and runs
// to its end.
void failureThenFinish(Cluster& c) {
  arriveInOrder(c, 3);
  c.awaitRunning({"n0", "n1", "n2"});
  c.node("n0").requestFailure();
  c.settle();
  c.finishAll();
}

}  // namespace

// A scenario as two test cases: "interleavings: WHAT" over MemoryStore (exact: a will runs inside
// the injection) and "interleavings over etcd: WHAT" over a 3-member etcd cluster (EtcdStore, a
// lease per node; SKIPPED without etcd): the round logic is the same, only the binding differs.
#define ON_BOTH_STORES(what, scenario)                                                        \
  static void scenario(Backend backend);                                                      \
  TEST_CASE("interleavings: " what, "[rendezvous][interleaving][v2]") {                       \
    scenario(Backend::Memory);                                                                \
  }                                                                                           \
  TEST_CASE("interleavings over etcd: " what, "[rendezvous][interleaving][etcd]") {           \
    scenario(Backend::Etcd);                                                                  \
  }                                                                                           \
  static void scenario(Backend backend)

ON_BOTH_STORES("a member's will fires at each point of the closer's join", willDuringCloserJoin) {
  struct Shape {
    int minNodes, maxNodes, count;
  };
  for (Shape shape : {Shape{1, 2, 2}, Shape{2, 3, 3}, Shape{3, 3, 3}}) {
    Scenario s;
    s.name = "--nnodes " + std::to_string(shape.minNodes) + ":" + std::to_string(shape.maxNodes) +
             ", " + std::to_string(shape.count) + " nodes, n0 dies while the closer joins";
    s.setup = nodes(shape.count, shape.minNodes, shape.maxNodes);
    s.drive = formAndFinish(shape.count);
    s.targets = {{nodeName(shape.count - 1), "join"}};
    s.inject = killing("n0");
    enumerate(s, backend);
  }
}

ON_BOTH_STORES("a spare dies at each point of the survivors' re-forming join", spareDiesDuringReform) {
  // --nnodes 2:3 with 4 agents: n3 waits as a spare; n2 dies; n0 and n1 re-form with the spare,
  // which dies at each point of their joins.
  Scenario s;
  s.name = "2:3 with a spare, the spare dies while n0 and n1 re-form";
  s.setup = nodes(4, 2, 3);
  s.drive = [](Cluster& c) {
    arriveInOrder(c, 3);
    c.awaitRunning({"n0", "n1", "n2"});
    c.arrive("n3");
    c.kill("n2");
    c.settle();
    c.finishAll();
  };
  s.targets = {{"n0", "join", 2}, {"n1", "join", 2}};  // either may close the round
  s.inject = killing("n3");
  enumerate(s, backend);
}

ON_BOTH_STORES("a member dies at each point of a newcomer's join (one, and MIN)", memberDiesDuringNewcomerJoin) {
  for (int newcomers : {1, 2}) {
    Scenario s;
    const int maxNodes = 2 + newcomers;
    s.name = "2:" + std::to_string(maxNodes) + " running, " + std::to_string(newcomers) +
             " newcomer(s) arrive, n1 dies while n2 joins";
    s.setup = [=](Cluster& c, const std::string& runId) {
      nodes(2 + newcomers, 2, maxNodes)(c, runId);
      // The running nodes' workers take 3 last calls to stop: the newcomers must wait for them.
      for (const char* running : {"n0", "n1"}) c.node(running).stopTime = 300ms * kTimeScale;
    };
    s.drive = [=](Cluster& c) {
      arriveInOrder(c, 2);
      c.awaitRunning({"n0", "n1"});
      for (int i = 2; i < 2 + newcomers; ++i) c.arrive(nodeName(i));
      c.settle();
      c.finishAll();
    };
    s.targets = {{"n2", "join"}};
    s.inject = killing("n1");
    enumerate(s, backend);
  }
}

ON_BOTH_STORES("a member dies at each point of the exit barrier (finish, leave)", memberDiesDuringExitBarrier) {
  for (int count : {2, 3}) {
    for (bool victimFinished : {false, true}) {
      Scenario s;
      s.name = "2:" + std::to_string(count) + ", " + std::to_string(count) + " nodes, n1 dies " +
               (victimFinished ? "in the exit barrier" : "while running") +
               " during n0's finish and leave";
      s.setup = nodes(count, 2, count);
      s.drive = finishFirst(count, "n0", victimFinished ? "n1" : "");
      s.targets = {{"n0", "finish"}, {"n0", "leave"}};
      s.inject = killing("n1");
      enumerate(s, backend);
    }
  }
}

ON_BOTH_STORES("a failure report races a member's death", failureReportRacesDeath) {
  Scenario s;
  s.name = "2:3, 3 nodes, n0 reports a failure while n1 dies";
  s.setup = nodes(3, 2, 3);
  s.drive = failureThenFinish;
  s.targets = {{"n0", "report"}, {"n0", "join", 2}};
  s.inject = killing("n1");
  enumerate(s, backend);
}

ON_BOTH_STORES("a member's link is cut at each point of a join (the closer's, its own) "
               "and of the exit barrier", linkCutDuringJoinAndBarrier) {
  // The node cut off notices (StoreLost), fences its workers and joins again as a newcomer.
  Scenario join = cutWhileJoining("2:3, 3 nodes, n0's link is cut while the closer joins", 3, 2, "n2");
  enumerate(join, backend);

  Scenario barrier = join;
  barrier.name = "2:3, 3 nodes, n1's link is cut during n0's finish and leave";
  barrier.drive = finishFirst(3, "n0");
  barrier.targets = {{"n0", "finish"}, {"n0", "leave"}};
  barrier.inject = cutting("n1");
  enumerate(barrier, backend);

  // Its own finish and leave: a cut anywhere there counts it out of `present` once (its will
  // while it leaves holds present-1 only, cleared in one batch with its own -1).
  Scenario ownLeave = barrier;
  ownLeave.name = "2:3, 3 nodes, n0's link is cut during its own finish and leave";
  ownLeave.drive = [](Cluster& c) {
    arriveInOrder(c, 3);
    c.awaitRunning({"n0", "n1", "n2"});
    c.node("n0").requestFinish();
    // n0 finishes, or (cut inside its finish) joins again: then the others finish.
    c.waitFor(3s * kTimeScale, [&] {
      auto& n = c.nodeLocked("n0");
      return n.finishReturned || (n.phase != Phase::Running && n.phase != Phase::Finishing);
    });
    c.finishAll();
  };
  ownLeave.inject = cutting("n0");
  enumerate(ownLeave, backend);

  // A node cut off after a round closed with it as rank 0, before it read the decision, connects
  // again and joins the next round: it must not bring the same MASTER_PORT, or the survivors run
  // two consecutive rounds on one port.
  Scenario own = join;
  own.name = "2:3, 3 nodes, n0's link is cut while it joins";
  own.targets = {{"n0", "join"}};
  enumerate(own, backend);
}

ON_BOTH_STORES("a member's link is cut while it joins a round of MIN=MAX nodes: the round forms with it",
               linkCutDuringJoinAtMinMax) {
  // Once its will has run, a node that joins the same round again on a new connection is a new
  // node: its old registration is dead, not the node. (Were it to join again under the id its
  // will had marked dead, the closer would strike both registrations: a 2:2 round could not form
  // until the join timeout.)
  enumerate(cutWhileJoining("2:2, 2 nodes, n0's link is cut while it joins", 2, 2, "n0"), backend);
}

ON_BOTH_STORES("a member dies at each point of its own re-forming join", memberDiesDuringOwnRejoin) {
  // A member that dies after setting its round-r will but before counting itself in `rejoined`
  // must count as gone from round r-1; otherwise the other survivors wait for it until the join
  // timeout and the job fails.
  Scenario s;
  s.name = "2:3, 3 nodes, n0 reports a failure; n1 dies while it joins again";
  s.setup = nodes(3, 2, 3);
  s.drive = failureThenFinish;
  s.targets = {{"n1", "join", 2}};
  s.inject = killing("n1");
  enumerate(s, backend);
}

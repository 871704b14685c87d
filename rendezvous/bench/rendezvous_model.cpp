// rendezvous_model: checks the cost model of docs/benchmarks/rendezvous.md at 10,000 to 100,000
// emulated agents, where sockets cannot go on one machine (file descriptors, ephemeral ports).
//
//   rendezvous_model [--sizes 10000,20000,50000,100000] [--groups 32]
//
// N agents run one round of MIN=MAX=N against one StoreCore (the server's state, what a
// drun-rendezvous daemon holds), one thread, with the store calls of C10dRendezvous::next() for a
// fresh job (as rendezvous_bench's generator: ExitBarrier::enter, checkJobConfig, startRound,
// RoundJoin, the last arrival's RoundCloser::tryClose, publishing in kKeysPerPublish pieces).
// Every call is encoded as its wire frames (protocol.hpp), so bytes are the wire's. Per size it
// prints calls, bytes, the largest frame, watch wakeups, the store's bytes and the core's CPU
// time, and checks them against the model (exit 1 naming what broke it):
//   calls  <= 11 N + 7 + N / kKeysPerPublish
//   trips  <= 4 N + 7 + N / kKeysPerPublish                 (round trips: batches count once)
//   bytes  <= N (kAgentBytes + kCloserBytesPerNode)        (linear: no O(N) value per agent;
//             + N^2 kHostListBytesPerNode up to kMaxHostsInResult nodes: the hosts list)
//   frame  <= kFrameBytesPerNode N + 64 KiB                 (the closer's reads and its decision)
// Then the two-level plan (docs/benchmarks/rendezvous.md, "tree"): G group stores of N/G agents
// and one root store of G group leaders, composed from measured flat rounds (the tree itself is a
// plan, not code).
//
//   rendezvous_model --store etcd [--sizes 8,64,256,1024,4096]
//
// The same round's calls as the requests an EtcdStore sends etcd for them (docs/etcd.md's table:
// a batch one txn, a tryGet one range, a compareSet a range and a txn, an append one put, a
// multiSet a txn per 64 keys, a wait for an absent key a range and up to two watch streams),
// plus each agent's session (its lease grants, its will executor's names-only reads and watch),
// by kind and per agent; checked against: requests <= kEtcdPerAgent N + N / 64 + 8 (constant
// per agent; the closer's decision is the N / 64). Keep-alives are left out: their number is the
// round's length over a third of the lease TTL, not a count of calls.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "drun/common/error.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/store/protocol.hpp"
#include "drun/rendezvous/rendezvous.hpp"
#include "drun/rendezvous/round_planner.hpp"
#include "drun/store/store_core.hpp"

using namespace drun;
using namespace drun::rdzv;

namespace {

// Model constants (docs/benchmarks/rendezvous.md): what one agent's calls cost on the wire, and
// per node of the round what the closer reads and writes (its descriptor in `joined`, its
// assignment, its roster line).
constexpr uint64_t kAgentBytes = 2048;
constexpr uint64_t kCloserBytesPerNode = 512;
constexpr uint64_t kFrameBytesPerNode = 160;
constexpr uint64_t kHostListBytesPerNode = 32;  // "=node17(10.0.0.17)\n": a name that does not fold
constexpr uint64_t kEtcdMaxRequest = 1536 * 1024;  // etcd's default --max-request-bytes

// The requests to etcd's gateway the same calls cost through EtcdStore, by kind.
struct EtcdRequests {
  uint64_t range = 0, txn = 0, put = 0, watch = 0, lease = 0;
  uint64_t total() const { return range + txn + put + watch + lease; }
};
constexpr uint64_t kEtcdPerAgent = 12;
constexpr uint64_t kEtcdOpsPerTxn = 128;  // etcd's --max-txn-ops (EtcdStore cuts multiSet there)

struct Cost {
  uint64_t calls = 0, bytes = 0, maxFrame = 0, wakeups = 0, storedBytes = 0;
  uint64_t trips = 0;  // round trips: a call alone, or a batch (StoreBatch) of them
  double coreMs = 0;  // CPU time of the store's work (encode/decode excluded)
  EtcdRequests etcd;
};

// One emulated round against one StoreCore; every call goes through `call` for its frames.
class Round {
 public:
  Round(int n, std::string runId) : n_(n), runId_(std::move(runId)) {}

  Cost run() {
    std::vector<StoreCore::ClientId> clients(n_);
    for (int i = 0; i < n_; ++i) clients[i] = core_.newClient();
    // Each agent's etcd session: its lease and the job lease's grant (EtcdStoreOptions::
    // jobLeaseTtl: answered "exists" but for the first), and its will executor's first look (the
    // will records' and the live keys' names) and its watch of the live keys' deletions.
    cost_.etcd.lease += 2 * static_cast<uint64_t>(n_);
    cost_.etcd.range += 2 * static_cast<uint64_t>(n_);
    cost_.etcd.watch += n_;
    std::vector<int> woken;
    for (int i = 0; i < n_; ++i) join(i, clients[i], woken);
    for (int i : woken) seat(i);
    if (static_cast<int>(seated_) != n_)
      throw Error("model: " + std::to_string(seated_) + " of " + std::to_string(n_) + " seated");
    cost_.storedBytes = core_.storedBytes();
    return cost_;
  }

 private:
  keys::NodeDescriptor descriptor(int i) const {
    keys::NodeDescriptor d;
    d.id = "a" + std::to_string(i);
    d.host = "node" + std::to_string(i);
    d.addr = "10." + std::to_string(i / 65536) + "." + std::to_string(i / 256 % 256) + "." +
             std::to_string(i % 256);
    d.localWorldSize = 8;
    d.masterPort = static_cast<uint16_t>(20000 + i % 40000);
    return d;
  }

  // Counts one call: its request and response frames; times the store's work.
  template <typename Work>
  wire::Response call(wire::Request q, Work work) {
    wire::Response p;
    p.op = q.op;
    const auto t0 = std::clock();
    work(q, p);
    cost_.coreMs += 1000.0 * double(std::clock() - t0) / CLOCKS_PER_SEC;
    count(q, p);
    return p;
  }

  void count(const wire::Request& q, const wire::Response& p) {
    std::string out;
    wire::encodeRequest(q, out);
    const size_t request = out.size();
    out.clear();
    wire::encodeResponse(p, out);
    ++cost_.calls;
    if (!inBatch_) ++cost_.trips;
    if (!inBatch_) countEtcd(q);
    cost_.bytes += request + out.size();
    cost_.maxFrame = std::max<uint64_t>(cost_.maxFrame, std::max(request, out.size()));
  }

  // A call outside a batch as EtcdStore sends it (a batch is one txn: beginBatch).
  void countEtcd(const wire::Request& q) {
    EtcdRequests& e = cost_.etcd;
    switch (q.op) {
      case wire::Op::TryGet: ++e.range; break;
      case wire::Op::Add: case wire::Op::SetWill: ++e.txn; break;
      case wire::Op::CompareSet: ++e.range, ++e.txn; break;
      case wire::Op::Append: ++e.put; break;
      case wire::Op::MultiSet: e.txn += (2 * q.keys.size() + kEtcdOpsPerTxn - 1) / kEtcdOpsPerTxn; break;
      // A wait for a key: its family read, a watch from now and, when others wrote since the read
      // (in a round that forms, every waiter but the last), one more from the read's revision.
      case wire::Op::Watch: e.range += 1, e.watch += 2; break;
      default: throw Error("model: no etcd mapping for a call of op " + std::to_string(int(q.op)));
    }
  }

  static wire::Request request(wire::Op op, const std::string& key) {
    wire::Request q;
    q.op = op;
    q.keys.push_back(key);
    return q;
  }

  std::optional<Bytes> tryGet(const std::string& key) {
    auto p = call(request(wire::Op::TryGet, key), [&](wire::Request& q, wire::Response& r) {
      if (const Bytes* v = core_.find(q.keys[0])) r.values.push_back(*v);
    });
    return p.values.empty() ? std::nullopt : std::optional<Bytes>(p.values[0]);
  }

  int64_t add(const std::string& key) {
    wire::Request q = request(wire::Op::Add, key);
    q.delta = 1;
    return call(q, [&](wire::Request& r, wire::Response& p) { p.number = core_.add(r.keys[0], 1); })
        .number;
  }

  Bytes compareSet(const std::string& key, const Bytes& desired) {
    wire::Request q = request(wire::Op::CompareSet, key);
    q.values = {"", desired};
    return call(q, [&](wire::Request& r, wire::Response& p) {
             p.values.push_back(core_.compareSet(r.keys[0], "", r.values[1]));
           })
        .values.at(0);
  }

  // The calls between beginBatch() and endBatch() are one round trip (a pipelined StoreBatch).
  void beginBatch() {
    ++cost_.trips;
    ++cost_.etcd.txn;
    inBatch_ = true;
  }
  void endBatch() { inBatch_ = false; }

  // C10dRendezvous::enterJob (one batch: the outcome, the config, the round), RoundJoin::run
  // (one batch).
  void join(int i, StoreCore::ClientId client, std::vector<int>& woken) {
    const keys::NodeDescriptor self = descriptor(i);
    beginBatch();
    tryGet(keys::outcome(runId_));
    keys::JobConfig config;
    config.minNodes = config.maxNodes = n_;
    config.setBy = "node0";
    compareSet(keys::config(runId_), keys::encodeJobConfig(config));
    tryGet(keys::currentRound(runId_));
    endBatch();
    beginBatch();
    wire::Request will;
    will.op = wire::Op::SetWill;
    will.will = keys::joinWill(runId_, 0, self.id, self.displayName());
    call(will, [&](wire::Request& q, wire::Response&) { core_.setWill(client, q.will); });
    add(keys::present(runId_));
    wire::Request append = request(wire::Op::Append, keys::joined(runId_, 0));
    append.values.push_back(keys::encodeDescriptor(self));
    call(append, [&](wire::Request& q, wire::Response&) { core_.append(q.keys[0], q.values[0]); });
    const int64_t arrivals = add(keys::count(runId_, 0));
    endBatch();
    if (arrivals >= n_) close();
    // watch(status, absent): answered when the decision's header lands (or at once).
    wire::Request watch = request(wire::Op::Watch, keys::status(runId_, 0));
    const auto t0 = std::clock();
    const auto id = core_.watch(client, watch.keys[0], std::optional<Bytes>(),
                                [&woken, i](const std::optional<Bytes>&) { woken.push_back(i); });
    cost_.coreMs += 1000.0 * double(std::clock() - t0) / CLOCKS_PER_SEC;
    if (id == 0) woken.push_back(i);
    watches_.push_back(watch);
  }

  // After the watch fired: the answer (status' header), then one batch: the assignment, the
  // next round's status and (up to kMaxHostsInResult nodes) the hosts list.
  void seat(int i) {
    ++cost_.wakeups;
    wire::Response answer;
    answer.op = wire::Op::Watch;
    answer.values.push_back(*core_.find(keys::status(runId_, 0)));
    count(watches_[static_cast<size_t>(i)], answer);
    beginBatch();  // RoundJoin::seat
    const bool assigned = tryGet(keys::assign(runId_, 0, descriptor(i).id)).has_value();
    tryGet(keys::status(runId_, 1));
    if (n_ <= kMaxHostsInResult) tryGet(keys::hosts(runId_, 0));
    endBatch();
    if (!assigned) throw Error("model: no assignment");
    ++seated_;
  }

  // RoundCloser::tryClose of a first round: left, changes, joined, left; compare_set(state);
  // the decision in kKeysPerPublish pieces.
  void close() {
    tryGet(keys::left(runId_, 0));
    tryGet(keys::changes(runId_, 0));
    auto nodes = keys::parseJoined(tryGet(keys::joined(runId_, 0)).value_or(""));
    tryGet(keys::left(runId_, 0));
    tryGet(keys::refill(runId_));  // restartCountFor: a refilled store's count
    RoundDecision d = decideRound(runId_, 0, pickMembers(std::move(nodes), n_), {0, 0, 0});
    if (compareSet(keys::state(runId_, 0), d.decision) != d.decision) throw Error("model: lost CAS");
    for (size_t first = 0; first < d.keys.size(); first += kKeysPerPublish) {
      const size_t last = std::min(d.keys.size(), first + kKeysPerPublish);
      wire::Request q;
      q.op = wire::Op::MultiSet;
      q.keys.assign(d.keys.begin() + first, d.keys.begin() + last);
      q.values.assign(d.values.begin() + first, d.values.begin() + last);
      call(q, [&](wire::Request& r, wire::Response&) { core_.multiSet(r.keys, r.values); });
    }
  }

  const int n_;
  const std::string runId_;
  StoreCore core_{kStoreLimits, StoreBudget{}};
  Cost cost_;
  bool inBatch_ = false;
  std::vector<wire::Request> watches_;
  size_t seated_ = 0;
};

std::vector<int> parseSizes(const std::string& text) {
  std::vector<int> sizes;
  for (size_t p = 0; p < text.size();) {
    size_t comma = text.find(',', p);
    if (comma == std::string::npos) comma = text.size();
    sizes.push_back(std::atoi(text.substr(p, comma - p).c_str()));
    if (sizes.back() < 1) throw InvalidArgument("bad size in --sizes " + text);
    p = comma + 1;
  }
  return sizes;
}

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", double(bytes) / (1024.0 * 1024.0));
  return buf;
}

// Checks one flat round against the model; returns the violations (empty: it holds).
std::string check(int n, const Cost& c) {
  const uint64_t N = static_cast<uint64_t>(n);
  std::string broken;
  if (c.calls > 11 * N + 7 + N / kKeysPerPublish + 1) broken += " calls";
  // (The outcome and the hosts list ride in batches: 4 round trips an agent.)
  if (c.trips > 4 * N + 7 + N / kKeysPerPublish + 1)
    broken += " trips";
  // Up to kMaxHostsInResult nodes every agent also reads the hosts list (bounded: N <= 1024).
  const uint64_t hosts = n <= kMaxHostsInResult ? N * N * kHostListBytesPerNode : 0;
  if (c.bytes > N * (kAgentBytes + kCloserBytesPerNode) + hosts) broken += " bytes";
  if (c.maxFrame > kFrameBytesPerNode * N + 65536) broken += " frame";
  if (c.wakeups != N) broken += " wakeups";
  return broken;
}

// The etcd requests of one round of each size, per agent by kind; the number of sizes that
// break the model.
int printEtcdModel(const std::vector<int>& sizes) {
  int failures = 0;
  std::printf("etcd: the requests an EtcdStore sends for one round of N agents, per agent by kind\n");
  std::printf("%7s | %6s %6s %6s %6s %6s | %9s %10s | %s\n", "N", "range", "txn", "put", "watch", "lease",
              "requests", "per agent", "model");
  for (int n : sizes) {
    const EtcdRequests e = Round(n, "model-" + std::to_string(n)).run().etcd;
    const auto N = static_cast<uint64_t>(n);
    const bool holds = e.total() <= kEtcdPerAgent * N + N / 64 + 8;
    failures += !holds;
    const double per = double(n);
    std::printf("%7d | %6.2f %6.2f %6.2f %6.2f %6.2f | %9llu %10.2f | %s\n", n, double(e.range) / per,
                double(e.txn) / per, double(e.put) / per, double(e.watch) / per, double(e.lease) / per,
                static_cast<unsigned long long>(e.total()), double(e.total()) / per, holds ? "ok" : "FAILS");
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {10000, 20000, 50000, 100000};
  bool sizesGiven = false, etcd = false;
  int groups = 32;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i];
    if (arg == "--sizes") {
      sizes = parseSizes(argv[i + 1]);
      sizesGiven = true;
    } else if (arg == "--groups") {
      groups = std::max(1, std::atoi(argv[i + 1]));
    } else if (arg == "--store" && std::string(argv[i + 1]) == "etcd") {
      etcd = true;
    } else {
      std::fprintf(stderr, "usage: rendezvous_model [--sizes 10000,...] [--groups G] [--store etcd]\n");
      return 2;
    }
  }
  if (etcd) {
    if (!sizesGiven) sizes = {8, 64, 256, 1024, 4096};
    try {
      const int broken = printEtcdModel(sizes);
      if (broken) std::fprintf(stderr, "rendezvous_model: %d size(s) break the etcd model\n", broken);
      return broken ? 1 : 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rendezvous_model: %s\n", e.what());
      return 1;
    }
  }
  int failures = 0;
  std::printf("flat: one store, one round of N agents (wire bytes of every call)\n");
  std::printf("%7s | %9s %10s %8s %11s %10s %11s %9s %9s | %s\n", "N", "calls", "calls/N", "trips/N",
              "bytes MiB", "bytes/N", "frame MiB", "store MiB", "core ms", "model");
  try {
    for (int n : sizes) {
      const Cost c = Round(n, "model-" + std::to_string(n)).run();
      const std::string broken = check(n, c);
      failures += !broken.empty();
      std::printf("%7d | %9llu %10.2f %8.2f %11s %10.0f %11s %9s %9.0f | %s%s\n", n,
                  static_cast<unsigned long long>(c.calls), double(c.calls) / n,
                  double(c.trips) / n,
                  mib(c.bytes).c_str(), double(c.bytes) / n, mib(c.maxFrame).c_str(),
                  mib(c.storedBytes).c_str(), c.coreMs, broken.empty() ? "ok" : "FAILS:",
                  broken.c_str());
      if (c.maxFrame > kEtcdMaxRequest)
        std::printf("%7s   largest frame over etcd's 1.5 MiB request limit: etcd needs the per-node "
                    "keys of SCALE.md\n", "");
    }
    std::printf("\ntree: %d group stores + one root store (composed from flat rounds)\n", groups);
    std::printf("%7s | %12s %14s %14s | %12s %14s\n", "N", "group agents", "group MiB/round",
                "group frame MiB", "root agents", "root MiB/round");
    for (int n : sizes) {
      const int perGroup = (n + groups - 1) / groups;
      const Cost group = Round(perGroup, "group").run();
      const Cost root = Round(groups, "root").run();
      failures += !check(perGroup, group).empty() + !check(groups, root).empty();
      std::printf("%7d | %12d %14s %14s | %12d %14s\n", n, perGroup, mib(group.bytes).c_str(),
                  mib(group.maxFrame).c_str(), groups, mib(root.bytes).c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rendezvous_model: %s\n", e.what());
    return 1;
  }
  if (failures) std::fprintf(stderr, "rendezvous_model: %d size(s) break the model\n", failures);
  return failures ? 1 : 0;
}

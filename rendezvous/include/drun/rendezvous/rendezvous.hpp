// Rendezvous: forms the job's membership for one round and hands each agent its place in it.
//
// Implementations: SingleNodeRendezvous (nnodes 1: no store, no network), the c10d-style store
// rendezvous (c10d_rendezvous.hpp: MIN:MAX nodes over a Store, embedded or remote server) and the
// static one (fixed node rank and count, master from --master-addr/--master-port).
//
// Ownership: the rendezvous owns its store connection and the MASTER_PORT reservation of the
// round it last returned (released when the next round starts or the object is destroyed).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "drun/common/error.hpp"
#include "drun/common/host_port.hpp"
#include "drun/common/progress.hpp"
#include "drun/rendezvous/backend.hpp"
#include "drun/store/store.hpp"

namespace drun::rdzv {

using std::chrono::milliseconds;
using namespace std::chrono_literals;

struct RendezvousOptions {
  RendezvousBackend backend = RendezvousBackend::C10d;  // --rdzv-backend
  // --rdzv-endpoint (host "" = none; port 0 = any, embedded server only)
  HostPort endpoint{"", 29400};
  std::string runId = "none";          // --rdzv-id
  int minNodes = 1;                    // --nnodes MIN:MAX
  int maxNodes = 1;
  int maxRestarts = 0;                 // --max-restarts: the job's restart budget (every node the same)
  std::optional<int> nodeRank;         // --node-rank (static: required; c10d: honoured if given)
  std::optional<bool> isHost;          // rdzv_conf is_host; nullopt = endpoint matches this host
  std::string localAddr;               // --local-addr: this node's address as peers reach it
  std::string masterAddr;              // --master-addr (static backend)
  std::optional<uint16_t> masterPort;  // --master-port (static backend)
  int localWorldSize = 1;              // workers on this node
  milliseconds joinTimeout = 600s;
  milliseconds lastCallTimeout = 30s;
  milliseconds closeTimeout = 30s;
  // Members lost and fewer than MIN left: the survivors wait this long for replacement nodes
  // (a newcomer takes a lost node's place) before the job fails. < 0: the join timeout (as
  // torchrun); 0: fail at once (the launcher's default under SLURM, where none comes).
  milliseconds replaceTimeout{-1};
  // A lost store (a restarted drun-rendezvous, the store's host restarting its agent, a cut link)
  // is retried this long after the loss; a fresh store is then refilled from what the survivors
  // know (their round and restart count). Past it every agent exits with an error.
  milliseconds reconnectTimeout = 30s;
  milliseconds heartbeatInterval = 1s;
  milliseconds heartbeatTimeout = 5s;
  milliseconds readTimeout = 60s;      // deadline of one store call
  milliseconds progressInterval = 30s; // a long wait is reported at this pace...
  ProgressSink say;                    // ...here (the store connect, the join); unset = silent
  std::string tokenFile;               // rdzv_conf token_file: the store's shared secret ("" =
                                       // DRUN_RDZV_TOKEN_FILE, else the store is open)
  // The etcd backend: --rdzv-endpoint's member list and the rdzv_conf keys etcd_*.
  std::string etcdEndpoints;           // "h1:2379,h2:2379,h3:2379" ("" = endpoint)
  std::string etcdUser;                // etcd_user ("" = no auth)
  std::string etcdPasswordFile;        // etcd_password_file: its first line (mode 600)
  std::string etcdCaFile;              // etcd_cacert: https, members verified against this CA
  std::string etcdPrefix = "/drun/";   // etcd_prefix: every key drun writes is under it
  // etcd_history_ttl: an ended job's outcome and history stay in etcd this long after its last
  // node left (on a lease of their own), then etcd removes them
  milliseconds etcdHistoryTtl = 3600s;
};

// What one agent gets from a completed round.
struct RoundResult {
  uint64_t round = 0;
  int nodeRank = 0;               // GROUP_RANK
  int nodeCount = 1;              // GROUP_WORLD_SIZE
  int worldSize = 1;              // WORLD_SIZE: sum of every node's worker count
  int rankOffset = 0;             // RANK of this node's local rank 0 (prefix sum)
  int restartCount = 0;           // the job's restarts so far: the same on every node
  std::string masterAddr;         // MASTER_ADDR: node rank 0's address
  uint16_t masterPort = 0;        // MASTER_PORT: reserved on node rank 0, fresh every round
  std::string storePrefix;        // key prefix of this round in the store ("" without a store)
  // Host of each node rank, for summaries. Filled for rounds of up to kMaxHostsInResult nodes:
  // every agent reading an O(N) list makes a round O(N^2) bytes (10,000 nodes: 2 GB through
  // the store); larger rounds leave it empty (the list stays in the store, keys::hosts).
  std::vector<std::string> hosts;
  // A spare that took a lost member's place in a running round (docs/recovery.md "A lost
  // node"): the recovery generation its workers join, and the job's restart count including that
  // recovery. 0 for a node that starts its workers with the round.
  uint64_t generation = 0;
  int generationRestartCount = 0;
  bool grew = false;  // that place is one a grow added at the end ("Elastic in place")
  // The store restarted empty and this round carries this node's previous round on unchanged
  // (store_refill.hpp): the same node ids at the same node ranks, the same world and restart
  // count. Every member reads the same two rounds, so every member decides alike; its workers
  // need not stop (MASTER_ADDR/PORT stay the previous round's: the workers use them).
  bool continuesPrevious = false;
};
inline constexpr int kMaxHostsInResult = 1024;

// A lost member's place in the running round, claimed by one survivor and offered to a spare
// (docs/recovery.md "A lost node").
struct Vacancy {
  uint64_t round = 0;
  std::string lostId;      // the lost member's node id (the vacancy's keys)
  std::string node;        // its name, for messages
  int nodeRank = 0;
  int rankOffset = 0;
  int localWorldSize = 1;
  // The recovery generation nodeRank and rankOffset are numbered in: 0, the round's decision (a
  // place a spare took keeps its lost member's), or the grow's that added the place. Shrinks and
  // grows since renumber it (drun/rendezvous/recovery_keys.hpp renumberPlace).
  uint64_t numberedIn = 0;
  // The round's `lost` counter when the place was claimed: the losses its generation accounts
  // for. A member lost after the claim (before a spare took the place) is news to that spare.
  int64_t lostAtClaim = 0;
};

// The root cause of a failed round, as every node prints it.
struct FailureRecord {
  int rank = 0;
  int localRank = 0;
  std::string node;           // the failing node's name ("host" or "host(addr)")
  int exitCode = 0;           // valid when signal == 0
  int signal = 0;
  int64_t pid = 0;
  int64_t timeMs = 0;         // wall clock of the failure, ms since the epoch
  std::string detailSource;   // "error file <path>" or "stderr" ("" = no detail)
  std::string detail;         // the error file's message or the last stderr lines
  int otherFailures = 0;      // other workers of that node that failed or were stopped after it
  bool final = false;         // the job's restart budget is spent: every agent exits
  // Shell convention: exit code, or 128 + signal.
  int statusCode() const { return signal ? 128 + signal : exitCode; }
};

// Something that happened to the job while this node's workers run (or wait in the exit
// barrier), reported through onJobEvent. Events carry the round they belong to: an agent that
// has not started that round yet keeps them until it has (nothing is lost between rounds).
struct JobEvent {
  enum class Kind {
    MemberLost,   // a member's agent died, went silent or was preempted: re-form
    NodeWaiting,  // a node waits to join a job with fewer than MAX nodes: re-form after last call
    Failed,       // a worker failed somewhere: `failure` is the root cause (final: budget spent)
    Succeeded,    // every member's workers succeeded: the job is over
    StoreLost,    // this node lost the store (connection or lease): fence, then try to rejoin
  };
  Kind kind = Kind::MemberLost;
  uint64_t round = 0;
  std::string reason;
  std::optional<FailureRecord> failure;  // Kind::Failed
};
const char* toString(JobEvent::Kind kind);

// The job ended while this node waited to join it (a spare, a late node): `exitCode` is the
// job's (0 when it succeeded).
class JobEnded : public Error {
 public:
  JobEnded(const std::string& what, int exitCode) : Error(what), exitCode_(exitCode) {}
  int exitCode() const { return exitCode_; }

 private:
  int exitCode_;
};

// Threading: one agent thread calls next(), reportFailure(), finish(), claimScaleUp(), leave(),
// abandon() (one at a time; they may block on the network, each call with a deadline); events
// are delivered through the onJobEvent callback from a rendezvous-owned thread.
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // Joins the next round; blocks until the round closes or the join timeout passes
  // (TimeoutError listing who joined). Throws JobEnded when the job ended while this node waited.
  virtual RoundResult next() = 0;
  // Reports that a worker of this node failed in the current round. Returns the job's root cause
  // for the round: this failure, or one another node reported first; `final` when the job's
  // budget (RendezvousOptions::maxRestarts restarts) is spent, or when `failure.final` already
  // says the job ends (this node cannot go on). Every node learns it through a Failed event.
  virtual FailureRecord reportFailure(const FailureRecord& failure) = 0;
  // This node's workers all succeeded: wait for the others (exit barrier) without closing
  // anything; a Succeeded event follows once every member's workers did. Returns false instead
  // when a member claimed the round for a scale-up first (claimScaleUp): the job re-forms, and
  // this node joins the next round (next()) as that member does.
  [[nodiscard]] virtual bool finish() = 0;
  // Before this node stops its workers to take waiting nodes in (a NodeWaiting event, after the
  // last call): claims the round's end for the scale-up. False when a member's workers already
  // succeeded (finish()): the job is ending, the workers go on, and the waiting nodes learn the
  // job's end. A finished member and a scale-up are the two ends of a round; without the claim
  // each waited for the other (the finished one in the exit barrier, the other in the next
  // round). May block on the store (with its deadline); throws on a store error.
  [[nodiscard]] virtual bool claimScaleUp() = 0;
  // After a StoreLost event, before next(): reconnects (retried for reconnect_timeout; throws
  // past it) and returns true when the store had restarted empty and this node refilled it with
  // its round (store_refill.hpp: every member lost it too, so nobody went on without this node;
  // the round next() forms may carry the running one on, RoundResult::continuesPrevious), false
  // when the store still held the job (only this node lost it: the others may re-form without
  // it, so its workers must stop). `knownRestarts`: the job's restart count as this node knows
  // it (in-process recoveries included, which the lost store counted): a refill carries at least
  // that. Backends without a refill return false.
  virtual bool reconnectAfterLoss(int knownRestarts) {
    (void)knownRestarts;
    return false;
  }
  // Leaves the job for good (it ended) without closing it for the others.
  virtual void leave() = 0;
  // Leaves as a lost node would (preempted): the others re-form without this node.
  virtual void abandon() = 0;
  virtual void onJobEvent(std::function<void(const JobEvent&)> callback) = 0;
  // `callback` runs, on the thread in next(), each time this node's join begins to wait for a
  // round of a job that runs without it (a newcomer, a spare: it may take a lost member's place
  // in the running round). Set it before the first next(). None without a shared store.
  virtual void onWaitingForRunningJob(std::function<void()> callback) {}
  // Replaces the job-wide value `name` (any bytes) with merge(its value, "" when none), atomically
  // (compare-and-set, retried while others change it), and returns what is stored then: the
  // agent's learned hang timeouts, merged by every node before each round. May block on the store
  // (each call with its deadline); throws on a store error. Without a shared store: merge("").
  // `merge` gets bytes another node wrote: it must accept anything.
  virtual std::string mergeShared(const std::string& name,
                                  const std::function<std::string(const std::string&)>& merge) {
    return merge("");
  }
  // Opens another connection to the job's store (no will; its own deadlines), for writers that
  // must not queue behind a blocking join: the agent's job history. Null without a
  // shared store. Callable from any thread.
  virtual std::unique_ptr<LivenessStore> connectSideStore() { return nullptr; }

  // In-process recovery (docs/recovery.md). The store the workers share: "host:port" as this
  // node reaches it (drun's store protocol; connect with connectSideStore() from here), or
  // nullopt when the rendezvous has none the workers can use (single node, static, etcd).
  virtual std::optional<std::string> workerStoreEndpoint() const { return std::nullopt; }
  // Spends one unit of the job's restart budget on a recovery in the current round: returns the
  // job's restart count including it (what every node reports), or nullopt when the budget is
  // spent (the failure then takes the restart path, which ends the job). Blocks on the store
  // (with its deadline); throws on a store error.
  virtual std::optional<int> spendRecovery() = 0;
  // A recovery of the current round fell back to a restart (or could not be opened): its unit
  // pays for the restart the failure report then asks for, which does not spend a second one.
  virtual void refundRecovery() = 0;
  // A lost node replaced in place (docs/recovery.md "A lost node"; none without a shared store).
  // Claims the places of the current round's members that were lost and that no other node
  // claimed, and returns them (each claimed by exactly one node). Blocks on the store (with its
  // deadline); throws on a store error.
  virtual std::vector<Vacancy> claimLostMembers() { return {}; }
  // Offers a claimed place to the spares: the one that takes it joins `generation` (whose restart
  // count is `restartCount`) with the lost member's node rank and ranks.
  virtual void postVacancy(const Vacancy& vacancy, uint64_t generation, int restartCount) {}
  // Withdraws an offer at its deadline: true when no spare took it (none can now), false when
  // one did first.
  virtual bool withdrawVacancy(const Vacancy& vacancy) { return true; }
  // The survivors shrink the current round in place without `count` withdrawn places
  // (docs/recovery.md "Elastic in place"): the exit barrier counts them as finished.
  virtual void dropMembers(int count) {}
  // A grow in place ("Elastic in place"): with a node waiting to join and the job's `nodeCount`
  // (as the generations made it) below MAX, claims the round's next grow (exactly one node; one
  // grow at a time) and returns its place: node rank `nodeCount`, rank offset `worldSize`. It is
  // posted and withdrawn as a lost member's; its claimer ends it once decided (endGrowth), which
  // lets the next grow be claimed. Blocks on the store (with its deadline); throws on its errors.
  virtual std::optional<Vacancy> claimGrowth(int nodeCount, int worldSize) { return std::nullopt; }
  virtual void endGrowth(const Vacancy& place) {}
};

// The single-node rendezvous: no network; reserves a free MASTER_PORT on `masterAddr`.
std::unique_ptr<Rendezvous> makeSingleNodeRendezvous(const RendezvousOptions& options);

// Picks the implementation the options ask for: single-node when maxNodes == 1 and no endpoint,
// else c10d (store-based) or static. Throws InvalidArgument for inconsistent options.
std::unique_ptr<Rendezvous> makeRendezvous(const RendezvousOptions& options);

}  // namespace drun::rdzv

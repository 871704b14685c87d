// Rendezvous: forms the job's membership for one round and hands each agent its place in it.
//
// Implementations: SingleNodeRendezvous (nnodes 1: no store, no network), the c10d-style store
// rendezvous (c10d_rendezvous.hpp: MIN:MAX nodes over a Store, embedded or remote server) and the
// static one (fixed node rank and count, master from --master-addr/--master-port).
//
// Threading: one agent thread calls next()/leave(); membership-change notification is delivered
// through the callback set with onMembershipChange, from a rendezvous-owned thread.
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

namespace drun::rdzv {

using std::chrono::milliseconds;
using namespace std::chrono_literals;

struct RendezvousOptions {
  std::string backend = "c10d";        // c10d | static
  std::string endpointHost;            // --rdzv-endpoint host ("" = none)
  uint16_t endpointPort = 29400;       // --rdzv-endpoint :port (0 = any, embedded server only)
  std::string runId = "none";          // --rdzv-id
  int minNodes = 1;                    // --nnodes MIN:MAX
  int maxNodes = 1;
  std::optional<int> nodeRank;         // --node-rank (static: required; c10d: honoured if given)
  std::optional<bool> isHost;          // rdzv_conf is_host; nullopt = endpoint matches this host
  std::string localAddr;               // --local-addr: this node's address as peers reach it
  std::string masterAddr;              // --master-addr (static backend)
  std::optional<uint16_t> masterPort;  // --master-port (static backend)
  int localWorldSize = 1;              // workers on this node
  milliseconds joinTimeout = 600s;
  milliseconds lastCallTimeout = 30s;
  milliseconds closeTimeout = 30s;
  milliseconds heartbeatInterval = 1s;
  milliseconds heartbeatTimeout = 5s;
  milliseconds readTimeout = 60s;      // deadline of one store call
};

// What one agent gets from a completed round.
struct RoundResult {
  uint64_t round = 0;
  int nodeRank = 0;               // GROUP_RANK
  int nodeCount = 1;              // GROUP_WORLD_SIZE
  int worldSize = 1;              // WORLD_SIZE: sum of every node's worker count
  int rankOffset = 0;             // RANK of this node's local rank 0 (prefix sum)
  std::string masterAddr;         // MASTER_ADDR: node rank 0's address
  uint16_t masterPort = 0;        // MASTER_PORT: reserved on node rank 0
  std::string storePrefix;        // key prefix of this round in the store ("" without a store)
  std::vector<std::string> hosts; // host of each node rank, for summaries
};

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // Joins the next round; blocks until the round closes or the join timeout passes
  // (TimeoutError listing who joined).
  virtual RoundResult next() = 0;
  // Leaves the job for good (success or final failure) without closing it for others.
  virtual void leave() = 0;
  // Whether the store reports that the current round is no longer valid (a node left or waits).
  virtual void onMembershipChange(std::function<void(const std::string& reason)> callback) = 0;
};

// The single-node rendezvous: no network; reserves a free MASTER_PORT on `masterAddr`.
std::unique_ptr<Rendezvous> makeSingleNodeRendezvous(const RendezvousOptions& options);

// Picks the implementation the options ask for: single-node when maxNodes == 1 and no endpoint,
// else c10d (store-based) or static. Throws InvalidArgument for inconsistent options.
std::unique_ptr<Rendezvous> makeRendezvous(const RendezvousOptions& options);

}  // namespace drun::rdzv

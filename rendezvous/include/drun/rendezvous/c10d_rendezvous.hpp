// The store-based (c10d-style) multi-node rendezvous: MIN:MAX nodes meet in rounds under
// rdzv/<run_id>/ (key scheme and value formats: keys.hpp; design: rendezvous/README.md).
//
// A round collects joiners and closes when MAX alive nodes joined, or when MIN did and the last
// call timeout passed since MIN was reached; it costs O(1) store operations per joiner plus O(N)
// for the one closer (no whole-state compare-and-set loop). Each agent's store connection
// carries its will: a node whose connection closes or goes silent is marked dead in the round
// at once, so a join never waits on a dead node, and agents of a closed round are told through
// onMembershipChange (a node of the round died, or a node waits to join).
//
// makeC10dRendezvous(options) decides whether this agent hosts the store: it embeds a
// StoreServer on the endpoint port when the endpoint is this host (rdzv_conf is_host, or the
// endpoint resolves to one of this host's addresses, or equals --local-addr), and falls back to
// being a client when the port is taken (another agent or a drun-rendezvous daemon serves it).
//
// Threading: one agent thread calls next()/leave(); the membership callback runs on a
// rendezvous-owned thread (one per closed round, with its own store connection).
// Ownership: the rendezvous owns its store connection, the embedded server (if any; kept up in
// leave() until the other agents left or closeTimeout passed) and the MASTER_PORT reservation.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "drun/rendezvous/keys.hpp"
#include "drun/rendezvous/rendezvous.hpp"
#include "drun/rendezvous/store.hpp"

namespace drun::rdzv {

class StoreServer;

// The outcome of a round, computed by its closer from the members' descriptors (arrival order).
struct RoundPlan {
  std::vector<int> nodeRank;      // per member (members' order)
  std::vector<int> rankOffset;    // per member: prefix sum of the local world sizes
  std::vector<int> memberAtRank;  // node rank -> member index
  int worldSize = 0;
  std::string masterAddr;  // node rank 0's address
  uint16_t masterPort = 0; // node rank 0's reserved port
};
// Node ranks: requested ranks (--node-rank) are honoured, the other nodes fill the free ranks in
// (host, arrival) order; rank offsets are prefix sums of the local world sizes. Throws
// InvalidArgument naming the nodes for a rank claimed twice or one out of range.
RoundPlan planRound(const std::vector<keys::NodeDescriptor>& members);

// The closer's decision for `members` (the alive joiners taken into the round: at most MAX, in
// arrival order): planRound's result, or an error (a node rank claimed twice) that every joiner
// reports. The closer writes compare_set(state, "" -> decision); if it won, multi_set(keys,
// values): each member's assignment, the hosts list, round = r + 1 and, last, status = the
// decision's header.
struct RoundDecision {
  keys::RoundState state;
  std::string decision;  // encodeState(state): the value of `state`
  std::vector<std::string> keys;
  std::vector<Bytes> values;
};
// The round's counters as the closer read them: `changes` before its snapshot of the joiners
// (the membership watch starts there), `left` after it (wills of joiners not taken count there).
struct RoundCounters {
  int64_t changes = 0;
  int64_t left = 0;
};
RoundDecision decideRound(const std::string& runId, uint64_t round,
                          const std::vector<keys::NodeDescriptor>& members, RoundCounters counters);

// How a c10d rendezvous reaches its store (tests and embedders build one; the factory below
// builds it from the options).
struct C10dStoreAccess {
  std::unique_ptr<Store> store;  // this agent's connection; its will is this node's liveness
  // Opens another connection for the membership watcher (no will); called once per round.
  std::function<std::unique_ptr<Store>()> connectWatcher;
  std::string selfAddress;       // this node's address as the others reach it
  std::string endpoint;          // "host:port", for messages
  std::unique_ptr<StoreServer> server;  // embedded server this agent hosts, or null
};

std::unique_ptr<Rendezvous> makeC10dRendezvous(const RendezvousOptions& options,
                                               C10dStoreAccess access);
// Connects to (or hosts) the store at options.endpointHost:endpointPort. Throws
// InvalidArgument for bad options, TimeoutError when no store answers within joinTimeout.
std::unique_ptr<Rendezvous> makeC10dRendezvous(const RendezvousOptions& options);

// Whether `host` names this machine: equals `localAddr`, or resolves to a loopback address or
// to an address of one of this host's interfaces.
bool isLocalEndpoint(const std::string& host, const std::string& localAddr = {});
// The local address the kernel would use to reach host:port (a connected UDP socket: nothing
// is sent). Throws NetworkError when the host does not resolve or has no route.
std::string routeSourceAddress(const std::string& host, uint16_t port);

}  // namespace drun::rdzv

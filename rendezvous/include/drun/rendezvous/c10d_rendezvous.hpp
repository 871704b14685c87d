// The store-based (c10d-style) multi-node rendezvous: MIN:MAX nodes meet in rounds under
// rdzv/<run_id>/ (key scheme and value formats: keys.hpp; design: docs/rendezvous.md).
//
// A round collects joiners and closes when MAX alive nodes joined, when (re-forming after a
// failure or a loss) every surviving member of the previous round is back, or when MIN did and
// the last call timeout passed since MIN was reached; it costs O(1) store operations per joiner
// plus O(N) for the one closer (no whole-state compare-and-set loop). Each agent's store
// connection carries its will: a node whose connection closes or goes silent is marked dead in
// the round at once, so a join never waits on a dead node.
//
// The job lives in the store too: a failure record per round (the first reported is the root
// cause every node prints; the closer of the next round advances the job's restart count from
// it), a finished counter (the exit barrier) and the job's outcome. Agents of a closed round
// learn what happens through onJobEvent (MembershipWatcher). A node that arrives while the job
// has MAX nodes is a spare: it waits without telling anyone and fills the next re-formed round.
//
// makeC10dRendezvous(options) decides whether this agent hosts the store: it embeds a
// StoreServer on the endpoint port when the endpoint is this host (rdzv_conf is_host, or the
// endpoint resolves to one of this host's addresses, or equals --local-addr), and falls back to
// being a client when the port is taken (another agent or a drun-rendezvous daemon serves it).
//
// Threading: one agent thread calls next()/reportFailure()/finish()/claimScaleUp()/leave()/
// abandon(); the event callback runs on a rendezvous-owned thread (one per closed round, with its
// own store connection).
// Ownership: the rendezvous owns its store connection, the embedded server (if any; kept up in
// leave() until the other agents left or closeTimeout passed) and the MASTER_PORT reservation.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "drun/rendezvous/keys.hpp"
#include "drun/rendezvous/network.hpp"
#include "drun/rendezvous/round_planner.hpp"
#include "drun/rendezvous/rendezvous.hpp"
#include "drun/store/store.hpp"

namespace drun::rdzv {

class StoreServer;

// How a c10d rendezvous reaches its store (tests and embedders build one; the factory below
// builds it from the options).
struct C10dStoreAccess {
  std::unique_ptr<LivenessStore> store;  // this agent's connection; its will is this node's liveness
  // Opens another connection (no will): the membership watcher's, once per round, and this
  // agent's own when it lost the store and joins again.
  std::function<std::unique_ptr<LivenessStore>()> connectWatcher;
  std::string selfAddress;       // this node's address as the others reach it
  std::string endpoint;          // "host:port", for messages
  // "host:port" the workers may reach the store at (drun's protocol: --recovery in-process);
  // "" when they cannot (the store is etcd)
  std::string workerEndpoint;
  std::unique_ptr<StoreServer> server;  // embedded server this agent hosts, or null
};

std::unique_ptr<Rendezvous> makeC10dRendezvous(const RendezvousOptions& options,
                                               C10dStoreAccess access);
// The longest single watch of the membership watcher: half the heartbeat timeout. A lost link
// shows as a watch with no reply after it plus the watcher connection's reply grace (the rest of
// the heartbeat timeout, less 100 ms).
milliseconds watchSlice(milliseconds heartbeatTimeout);
// Connects to (or hosts) the store at options.endpoint. Throws
// InvalidArgument for bad options, TimeoutError when no store answers within joinTimeout.
std::unique_ptr<Rendezvous> makeC10dRendezvous(const RendezvousOptions& options);
// The same rendezvous with its store in etcd (backend "etcd"/"etcd-v3"; etcd_store.hpp): every
// agent is a client of the cluster at options.etcdEndpoints, its liveness an etcd lease with
// the heartbeat timeout as TTL. Throws InvalidArgument (options), NetworkError/TimeoutError (no
// member reachable within the join timeout, at most 60 s), AuthError.
std::unique_ptr<Rendezvous> makeEtcdRendezvous(const RendezvousOptions& options);
// drun status on etcd: a store on the cluster `options` names (etcdEndpoints, auth, prefix;
// readTimeout for each call) that reads only (no lease is granted, no will: it works while
// etcd has a leader but no quorum to write), and the run ids that have a round key there.
std::unique_ptr<LivenessStore> openEtcdStatusStore(const RendezvousOptions& options);
std::vector<std::string> listEtcdJobs(const RendezvousOptions& options);

}  // namespace drun::rdzv

// StoreServer: serves the Store over TCP (wire protocol in protocol.hpp) to TcpStore clients.
// The same class runs the standalone drun-rendezvous daemon and the server an agent embeds.
//
// One io thread owns all state (the StoreCore, every session): nothing is locked, and no client
// can stall another because nothing blocks on a client: each connection is a session with an
// async reader and writer, a bounded output queue (a client that stops reading is dropped), a
// lease (a client silent for its lease timeout is dropped) and per-request deadlines (a blocking
// call is answered with a timeout status at its deadline). A dropped or closed connection's
// waiters are discarded and its will is run.
//
// Memory: every byte held for a client counts against a budget per connection and in all
// (input, output, blocking calls' keys and wills, stored keys and values in all and per job);
// over one, the client gets InvalidArgument naming the option, or is dropped (docs/protocol.md,
// "Limits", states the resulting bound on the process's memory). Admission: a
// connection is pending until its hello (and proof) is complete, within handshakeTimeout; at
// maxPendingConnections the oldest pending one is dropped for a new one; the connection caps
// count admitted connections only.
//
// Threading: the constructor binds (so port() is known at once, also with port 0); then either
// run() serves on the calling thread until stop(), or start() spawns the io thread. stop() may
// be called from any thread, any number of times; it closes every connection and returns once
// the io thread is done (when called from inside the io thread, it only requests the stop).
// Ownership: the destructor stops and joins.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "drun/common/host_port.hpp"
#include "drun/store/store_core.hpp"

namespace boost::asio {
class io_context;
}

namespace drun::rdzv {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

struct StoreServerOptions {
  // The address to listen on ("" = 0.0.0.0); port 0 = any free port, see port().
  HostPort listen{"0.0.0.0", 29400};
  milliseconds leaseTimeout = 10s;        // silence allowed when the client asks for no lease
  milliseconds minLeaseTimeout = 100ms;   // client-requested leases are clamped to [min, max]
  milliseconds maxLeaseTimeout = 5min;    // a dead client's waiters and will wait at most this
  milliseconds handshakeTimeout = 3s;     // hello (and proof) complete within this of connecting
  size_t maxOutputQueueBytes = 64 << 20;  // per connection; beyond it the client is dropped
  // A job whose keys ("<orphanRoot><run id>/...") no connected client's will names any more (its
  // agents all died) is removed after orphanTtl; 0 = never (an agent's embedded server ends with
  // its job). The drun-rendezvous daemon sets it: a long-lived server does not collect dead jobs.
  milliseconds orphanTtl{0};
  std::string orphanRoot = "rdzv/";

  // Limits against hostile or broken peers (docs/protocol.md, "Limits"). The server never
  // allocates for a length a peer claims: its input buffer grows with the bytes that arrived.
  size_t maxConnections = 32768;          // admitted connections in all; beyond: HelloStatus::Busy
  size_t maxConnectionsPerPeer = 1024;    // admitted connections from one peer address
  size_t maxPendingConnections = 256;     // before their hello/proof; the oldest is dropped
  size_t maxOutputBytes = 512u << 20;     // queued output of all connections; the heaviest is dropped
  // Blocking calls' keys (+ digests of watched values) and the will, per connection and in all;
  // beyond: InvalidArgument.
  size_t maxCallBytesPerConnection = 64u << 20;
  size_t maxCallBytes = 256u << 20;
  // Keys + values stored, in all and per job ("<orphanRoot><id>/"); beyond: InvalidArgument.
  size_t maxStoredBytes = size_t{1} << 30;
  size_t maxStoredBytesPerJob = 256u << 20;
  size_t maxInputBytesPerConnection = (64u << 20) + 65536;  // one frame of the largest size
  size_t maxInputBytes = 512u << 20;      // buffered input of all connections together
  milliseconds stalledFrameTimeout = 30s; // a frame must arrive whole within this of its start
  size_t maxWaitersPerConnection = 256;   // blocking calls pending on one connection
  size_t maxRequestsPerBatch = 64;        // requests served before the io thread serves others
  // Access (docs/protocol.md, "Access"). With a token, every connection proves it in the
  // hello (challenge-response; the token never goes on the wire) before any key is touched.
  // jobTokens: a client naming run id R in its hello proves jobTokens[R] instead and may touch
  // only "<orphanRoot>R/..."; when jobTokens is set and `token` is not, a client of any other run
  // id is refused. Both empty: anyone who can reach the port may use the store.
  std::string token;
  std::map<std::string, std::string> jobTokens;
  StoreLimits limits = kStoreLimits;      // key, value, keys per request
  size_t maxFrameBytes = 64u << 20;       // one frame body
};

// Counters for tests, benchmarks and the daemon's log; read from any thread.
struct StoreServerStats {
  uint64_t connectionsAccepted = 0;
  uint64_t connectionsOpen = 0;
  uint64_t requestsServed = 0;
  uint64_t protocolErrors = 0;     // connections closed for malformed input
  uint64_t leasesExpired = 0;      // connections closed for silence
  uint64_t slowClientsDropped = 0; // connections closed for an output queue over the bound
  uint64_t willsRun = 0;
  uint64_t waitersPending = 0;     // blocking calls (get/wait/multiGet/watch) not yet answered
  uint64_t orphanJobsRemoved = 0;
  uint64_t connectionsRefused = 0; // over maxConnections / maxConnectionsPerPeer
  uint64_t stalledDropped = 0;     // connections closed for a frame not whole in time
  uint64_t inputBytesBuffered = 0; // received, not yet decoded, all connections
  uint64_t authRefused = 0;        // connections that did not prove the token
  uint64_t connectionsPending = 0; // in their handshake now
  uint64_t pendingEvicted = 0;     // pending connections dropped for newer ones
  uint64_t handshakesExpired = 0;  // connections dropped at the handshake deadline
  uint64_t outputBytesQueued = 0;  // replies not yet written, all connections
  uint64_t callBytesHeld = 0;      // blocking calls' keys and wills, all connections
  uint64_t storedBytes = 0;        // keys + values (+ per-key overhead) in the store
  uint64_t overBudget = 0;         // calls and wills refused over a byte budget
};

class StoreServer {
 public:
  // Binds and listens on options.listen; throws NetworkError naming the address.
  // Raises the RLIMIT_NOFILE soft limit to the hard limit (thousands of connections).
  explicit StoreServer(const StoreServerOptions& options = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  uint16_t port() const;            // the bound port (the chosen one when options.listen.port was 0)
  const std::string& host() const;  // options.listen.host

  void start();  // serve on a new io thread; returns at once
  void run();    // serve on the calling thread until stop()
  void stop();   // any thread; idempotent

  StoreServerStats stats() const;
  // When a connection's will last ran, nullopt if none has: its client went without clearing
  // it (a lease expired behind a cut link or a stopped process; a client that gave up on a
  // connection that answered nothing and closed it; a killed process) and may come back to ask
  // for what it missed. Any thread.
  std::optional<std::chrono::steady_clock::time_point> lastWillRun() const;

  // Monitoring (drun-rendezvous --http, --state-dir): calls `attach` at once with the server's io
  // context and store, so that what it sets up (an HTTP endpoint, a write observer, a timer) runs
  // on the io thread beside the sessions. Call before start()/run(); what it attaches may read
  // the store and observe its writes (StoreCore::observeWrites), never write to it, and must
  // never block. The one write outside a session: `attach` itself, running before the server
  // serves, may restore kept keys into the store (drun-rendezvous --state-dir).
  void attach(const std::function<void(boost::asio::io_context&, StoreCore&)>& attach);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace drun::rdzv

// The phase of one store server connection, as one explicit state machine (rendezvous/README.md,
// "Connection phases"): Hello -> Auth -> Serving -> Draining -> Closed. One table says which event
// moves which phase where; nothing else decides it.
//
// Threading: pure functions and values.
#pragma once

#include <optional>

namespace drun::rdzv::server {

enum class SessionPhase {
  Hello,     // connected, its hello not complete (counts against maxPendingConnections)
  Auth,      // hello answered, the token's proof not complete (pending too)
  Serving,   // admitted: requests are served (counts against the connection caps)
  Draining,  // told why it ends (an error, a refusal): its output is flushed, then closed
  Closed,    // socket closed, waiters dropped, will run
};

enum class SessionEvent {
  OpenHello,      // a hello on a store without a token
  TokenHello,     // a hello on a store with a token: the proof comes next
  ProofAccepted,  // the client proved the token
  Refuse,         // a reply that ends the connection is queued (Busy, version, wrong proof, protocol error)
  Flushed,        // a draining connection's output is out (or its grace ran out)
  Drop,           // closed now: EOF, read/write error, deadline, lease, stall, eviction, stop
};

const char* toString(SessionPhase phase);
const char* toString(SessionEvent event);

// The phase `event` leads to from `phase`; nullopt when the event cannot happen there.
std::optional<SessionPhase> nextPhase(SessionPhase phase, SessionEvent event);

// Before Serving: the connection has not been admitted (the handshake deadline applies).
inline bool isHandshake(SessionPhase phase) {
  return phase == SessionPhase::Hello || phase == SessionPhase::Auth;
}

}  // namespace drun::rdzv::server

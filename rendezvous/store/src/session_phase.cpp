#include "session_phase.hpp"

namespace drun::rdzv::server {

const char* toString(SessionPhase phase) {
  switch (phase) {
    case SessionPhase::Hello: return "Hello";
    case SessionPhase::Auth: return "Auth";
    case SessionPhase::Serving: return "Serving";
    case SessionPhase::Draining: return "Draining";
    case SessionPhase::Closed: return "Closed";
  }
  return "?";
}

const char* toString(SessionEvent event) {
  switch (event) {
    case SessionEvent::OpenHello: return "OpenHello";
    case SessionEvent::TokenHello: return "TokenHello";
    case SessionEvent::ProofAccepted: return "ProofAccepted";
    case SessionEvent::Refuse: return "Refuse";
    case SessionEvent::Flushed: return "Flushed";
    case SessionEvent::Drop: return "Drop";
  }
  return "?";
}

std::optional<SessionPhase> nextPhase(SessionPhase phase, SessionEvent event) {
  using P = SessionPhase;
  using E = SessionEvent;
  struct Row {
    P from;
    E event;
    P to;
  };
  static constexpr Row kTable[] = {
      {P::Hello, E::OpenHello, P::Serving},     {P::Hello, E::TokenHello, P::Auth},
      {P::Hello, E::Refuse, P::Draining},       {P::Hello, E::Drop, P::Closed},
      {P::Auth, E::ProofAccepted, P::Serving},  {P::Auth, E::Refuse, P::Draining},
      {P::Auth, E::Drop, P::Closed},            {P::Serving, E::Refuse, P::Draining},
      {P::Serving, E::Drop, P::Closed},         {P::Draining, E::Flushed, P::Closed},
      {P::Draining, E::Drop, P::Closed},
  };
  for (const Row& row : kTable)
    if (row.from == phase && row.event == event) return row.to;
  return std::nullopt;
}

}  // namespace drun::rdzv::server

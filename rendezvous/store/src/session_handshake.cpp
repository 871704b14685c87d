// Session: the hello, the token's proof, admission. See store_session.hpp.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "drun/common/safe_text.hpp"
#include "store_session.hpp"

namespace drun::rdzv::server {
namespace {

uint32_t clampMs(milliseconds ms) {
  if (ms.count() <= 0) return 0;
  if (ms.count() >= 0xffffffffLL) return 0xffffffffu;
  return static_cast<uint32_t>(ms.count());
}

std::string encoded(const wire::HelloReply& reply) {
  std::string out;
  wire::encodeHelloReply(reply, out);
  return out;
}

}  // namespace

// Answers the hello: refused (another version; the connection caps), on to the proof (a token),
// or admitted. False when the connection ends here.
bool Session::answerHello(const wire::Hello& hello) {
  wire::HelloReply reply;
  if (hello.version != wire::kVersion) {
    reply.status = wire::HelloStatus::VersionMismatch;
    queue(encoded(reply));
    spdlog::warn("store server: refused {}: it speaks protocol version {}, this server {}", peer_,
                 hello.version, wire::kVersion);
    drain("client speaks protocol version " + std::to_string(hello.version));
    return false;
  }
  // The caps count admitted connections only: a crowd that never finishes its hello costs a
  // place among maxPendingConnections (the oldest is dropped), never a member's seat.
  if (std::string why = state_.refusal(address_); !why.empty()) {
    state_.counters.refused++;
    spdlog::warn("store server: refused a connection from {}: {}", address_, why);
    reply.status = wire::HelloStatus::Busy;
    queue(encoded(reply));
    drain("refused: " + why);
    return false;
  }
  const auto& o = state_.options;
  milliseconds lease = hello.leaseMs == 0 ? o.leaseTimeout : milliseconds(hello.leaseMs);
  lease = std::clamp(lease, o.minLeaseTimeout, o.maxLeaseTimeout);
  reply.leaseMs = clampMs(lease);
  scope_ = hello.scope;
  clientNonce_ = hello.nonce;
  const bool tokenRequired = !o.token.empty() || !o.jobTokens.empty();
  if (auto job = o.jobTokens.find(scope_); !scope_.empty() && job != o.jobTokens.end()) {
    token_ = job->second;
    keyPrefix_ = o.orphanRoot + scope_ + "/";
  } else {
    token_ = o.token;  // empty with jobTokens only: no proof can succeed
  }
  if (tokenRequired) {
    serverNonce_ = wire::randomNonce();
    reply.nonce = serverNonce_;
    reply.tokenRequired = true;
    pendingLease_ = lease;  // granted once the proof is in; until then the handshake deadline
    transition(SessionEvent::TokenHello, "job '" + printableScope() + "'");
  } else {
    admit(SessionEvent::OpenHello, lease);
  }
  queue(encoded(reply));
  spdlog::debug("store server: {} connected (lease {}ms, job '{}', token {})", peer_,
                lease.count(), printableScope(), tokenRequired ? "required" : "none");
  return phase_ != SessionPhase::Closed;
}

// The client's proof of the token: the connection is admitted with the lease it asked for, or
// refused (logged, counted) and closed once told.
bool Session::checkProof(const wire::Mac& mac) {
  wire::AuthReply reply;
  const bool ok = !token_.empty() &&
                  wire::equalMacs(mac, wire::clientProof(token_, clientNonce_, serverNonce_, scope_));
  if (ok) {
    reply.mac = wire::serverProof(token_, clientNonce_, serverNonce_, scope_);
    admit(SessionEvent::ProofAccepted, pendingLease_);
  } else {
    reply.status = wire::AuthStatus::Refused;
    state_.counters.authRefused++;
  }
  std::string out;
  wire::encodeAuthReply(reply, out);
  queue(std::move(out));
  if (ok) return phase_ != SessionPhase::Closed;
  const std::string why =
      token_.empty() ? "no token on this server for job '" + printableScope() + "'"
                     : "wrong token" + (scope_.empty() ? "" : " for job '" + printableScope() + "'");
  spdlog::warn("store server: refused {}: {}", peer_, why);
  drain("refused: " + why);
  return false;
}

// Serving from here: a seat under the connection caps, out of the pending set, the lease the
// client asked for instead of the handshake deadline.
void Session::admit(SessionEvent event, milliseconds lease) {
  if (!transition(event, "admitted")) return;
  seat_ = std::make_unique<Seat>(state_, address_);
  state_.handshaking.erase(id_);
  state_.counters.pending = state_.handshaking.size();
  lease_ = lease;
  lastHeard_ = Clock::now();
  armDeadline();
}

std::string Session::printableScope() const { return text::printable(scope_, {wire::kMaxScopeBytes}); }

}  // namespace drun::rdzv::server

// Session: one connection of the store server. Its phase (session_phase.hpp) is the one state:
// Hello and Auth before it is admitted (the handshake deadline, maxPendingConnections), Serving
// with a Seat under the connection caps, Draining while a last reply is flushed, Closed. Three
// activities on the io thread: a reader coroutine (hello, proof, then frames -> StoreCore; the
// answers to what one read brought go out in one send, flush()), a writer coroutine (what
// flush() could not send at once, and answers to blocking calls) and one timer for the
// handshake deadline, the lease and the stalled-frame deadline. Blocking calls are a
// BlockingCalls unit of their own.
//
// Files: store_session.cpp (phases, reading, deadlines, writing), session_handshake.cpp (hello,
// proof, admission), session_requests.cpp (requests -> StoreCore, scope checks, wills).
// Threading: the io thread only. Ownership: ServerState::sessions holds it; its coroutines and
// timers hold it alive (or weakly) until they return.
#pragma once

#include <utility>  // before Asio: awaitable.hpp uses std::exchange

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "blocking_calls.hpp"
#include "server_state.hpp"
#include "session_phase.hpp"

namespace drun::rdzv::server {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(ServerState& state, tcp::socket socket, uint64_t id, std::string address);
  ~Session();

  void begin();  // starts the reader, the writer and the handshake deadline
  // Closes now (-> Closed): drops the waiters, runs the will (unless the server is stopping).
  void close(const std::string& reason);
  SessionPhase phase() const { return phase_; }
  size_t queuedBytes() const { return outBytes_; }
  const std::string& peer() const { return peer_; }

 private:
  // store_session.cpp
  bool transition(SessionEvent event, const std::string& reason);
  asio::awaitable<void> reader();
  asio::awaitable<bool> readSome(size_t want, boost::system::error_code& ec);
  size_t bytesWanted(size_t needed) const;
  size_t handshakeWant(size_t needed) const;
  bool overInputBudget();
  void account(size_t buffered);
  void notePartialFrame(bool consumedSome);
  void drain(const std::string& reason);
  Clock::time_point deadline() const;
  void armDeadline();
  void onDeadline();
  void queue(std::string frame);
  void send(const wire::Response& response);
  void protocolError(const std::string& why);
  asio::awaitable<void> writer();
  void flush();
  void written(size_t n);

  // session_handshake.cpp
  bool answerHello(const wire::Hello& hello);
  bool checkProof(const wire::Mac& mac);
  void admit(SessionEvent event, milliseconds lease);
  std::string printableScope() const;

  // session_requests.cpp
  void handle(wire::Request q);
  bool serve(wire::Request& q, wire::Response& p);
  std::string outOfScope(const wire::Request& q) const;
  void setWill(Store::Will will);
  bool startBlocking(wire::Request& q, wire::Response& p);

  ServerState& state_;
  tcp::socket socket_;
  uint64_t id_;
  std::string address_;  // the peer's address, for the per-address cap
  std::string peer_;     // address:port, for the log
  SessionPhase phase_ = SessionPhase::Hello;
  std::unique_ptr<Seat> seat_;  // once admitted
  StoreCore::ClientId client_;
  std::shared_ptr<BlockingCalls> calls_;
  size_t willBytes_ = 0;   // the will's share of the `calls` budget

  // The hello's outcome
  std::string scope_;      // the run id the client named in its hello
  std::string keyPrefix_;  // with a job's own token: the only keys it may touch ("" = all)
  std::string token_;      // what this client must prove ("" in Auth: nothing can)
  milliseconds pendingLease_{0};
  wire::Nonce clientNonce_{}, serverNonce_{};

  // Input, output, deadlines
  wire::ReceiveBuffer in_;
  size_t accounted_ = 0;  // in_.size() as last counted in the server's input budget
  std::optional<Clock::time_point> partialSince_;  // when the frame being received began
  std::deque<std::string> out_;
  size_t outBytes_ = 0;
  bool answering_ = false;  // the reader is serving what one read brought: flush() after
  bool writing_ = false;    // the writer has a write in flight
  std::vector<asio::const_buffer> flushBuffers_;
  asio::steady_timer writeSignal_;  // cancelled to wake the writer
  asio::steady_timer deadlineTimer_;
  Clock::time_point handshakeDeadline_;
  Clock::time_point lastHeard_;
  milliseconds lease_{0};
  std::string drainReason_;
};

}  // namespace drun::rdzv::server

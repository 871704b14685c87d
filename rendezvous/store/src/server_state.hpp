// What the sessions of one StoreServer share: its options, the io context, the StoreCore, the
// sessions, admission (connections still in their handshake, seats of admitted ones) and the
// byte budgets of what the server holds for its clients (input, output, blocking calls + wills).
//
// Threading: everything here is touched on the io thread only, except the atomic counters.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>

#include "drun/store/protocol.hpp"
#include "drun/store/store_core.hpp"
#include "drun/store/store_server.hpp"

namespace drun::rdzv::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

struct Counters {
  std::atomic<uint64_t> accepted{0}, open{0}, requests{0}, protocolErrors{0}, leasesExpired{0},
      slowDropped{0}, wills{0}, waiters{0}, orphansRemoved{0}, refused{0}, stalled{0},
      inputBuffered{0}, authRefused{0}, pendingEvicted{0}, handshakesExpired{0}, pending{0},
      outputQueued{0}, callBytes{0}, storedBytes{0}, overBudget{0};
  std::atomic<int64_t> lastWillRun{0};  // steady_clock ticks of the last will run; 0: none yet
};

// Bytes of one kind held for clients: bounded per connection and in all. The caller decides
// what happens over a bound (a refused call, a dropped connection); this only counts and says.
class ByteBudget {
 public:
  ByteBudget(size_t total, std::string totalOption, size_t perConnection,
             std::string perConnectionOption);
  // "" when `more` bytes on top of the `held` of one connection fit both bounds; else why not,
  // naming the option that would be passed.
  std::string overBy(size_t held, size_t more) const;
  void add(size_t bytes) { used_ += bytes; }
  void remove(size_t bytes) { used_ -= bytes; }
  size_t used() const { return used_; }
  size_t total() const { return total_; }
  size_t perConnection() const { return perConnection_; }

 private:
  size_t total_, perConnection_;
  std::string totalOption_, perConnectionOption_;
  size_t used_ = 0;
};

class Session;

// A response to request `id` with `status` and nothing else yet.
wire::Response answer(wire::Op op, uint64_t id, wire::Status status);

struct ServerState {
  explicit ServerState(const StoreServerOptions& options);

  // Why an admitted connection from `address` would pass the connection caps ("" = it fits).
  std::string refusal(const std::string& address) const;
  void noteWaiters() { counters.waiters = core.waiterCount(); }
  void noteStored() { counters.storedBytes = core.storedBytes(); }

  // Declared in this order so that the sessions go first, then the io context (whose pending
  // handlers may hold the last reference to a session), while what they touch still exists.
  StoreServerOptions options;
  wire::Limits wireLimits;
  StoreCore core;
  std::set<uint64_t> handshaking;  // sessions not admitted (no Seat), oldest (lowest id) first
  std::unordered_map<std::string, size_t> seatsByAddress;
  size_t seats = 0;
  ByteBudget input, output, calls;
  bool stopping = false;
  Counters counters;
  asio::io_context ioc;
  std::unordered_map<uint64_t, std::shared_ptr<Session>> sessions;
};

// An admitted connection's place under maxConnections and maxConnectionsPerPeer; given back
// when destroyed.
class Seat {
 public:
  Seat(ServerState& state, std::string address);
  ~Seat();
  Seat(const Seat&) = delete;
  Seat& operator=(const Seat&) = delete;

 private:
  ServerState& state_;
  std::string address_;
};

}  // namespace drun::rdzv::server

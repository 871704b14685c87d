// BlockingCalls: the blocking calls (get, wait, multiGet, watch) one store server connection has
// pending: each a StoreCore waiter plus a deadline timer; whichever fires first answers the call.
// A woken call re-checks the state (a key may have been deleted again, a watched value changed
// back) and waits on. A watch keeps the digest of the value it knows (KnownValue), not the value.
// Every byte a call holds (its keys, three times: here, in the core's waiter and its index; the
// digest; the timer) is charged to the server's `calls` ByteBudget until the call ends.
//
// Threading: the io thread only. Ownership: held by its Session through a shared_ptr; timers and
// core callbacks hold weak references and do nothing once it is gone. The session checks the
// count and the budget (session_requests.cpp) before start().
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "drun/store/protocol.hpp"
#include "drun/store/store_core.hpp"
#include "server_state.hpp"

namespace drun::rdzv::server {

class BlockingCalls : public std::enable_shared_from_this<BlockingCalls> {
 public:
  using Send = std::function<void(const wire::Response&)>;

  BlockingCalls(ServerState& state, StoreCore::ClientId client, Send send);
  ~BlockingCalls();

  // The bytes a call of request `q` holds while it waits.
  static size_t costOf(const wire::Request& q);
  // Registers `q` as a waiter with its deadline; false when it is answered at once (`p` filled).
  bool start(wire::Request& q, wire::Response& p);
  // Forgets every call without answering (the connection is gone); releases their bytes.
  void clear();
  size_t size() const { return calls_.size(); }
  size_t bytes() const { return bytes_; }

 private:
  struct Call {
    wire::Op op;
    uint64_t requestId;
    std::vector<std::string> keys;
    uint32_t timeoutMs;
    std::optional<KnownValue> known;  // Watch: what the client knows
    StoreCore::WaiterId waiter = 0;
    std::unique_ptr<boost::asio::steady_timer> timer;
    size_t cost = 0;
  };

  bool awaitInCore(uint64_t seq, Call& call);
  void fillReply(const Call& call, wire::Response& p) const;
  void finish(uint64_t seq);
  void timeOut(uint64_t seq);
  Call take(std::unordered_map<uint64_t, Call>::iterator it);

  ServerState& state_;
  StoreCore::ClientId client_;
  Send send_;
  std::unordered_map<uint64_t, Call> calls_;
  uint64_t lastSeq_ = 0;
  size_t bytes_ = 0;
};

}  // namespace drun::rdzv::server

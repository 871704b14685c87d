#include "blocking_calls.hpp"

#include <boost/asio/post.hpp>

namespace drun::rdzv::server {
namespace {

// Beyond its bytes, what one key of a waiting call costs (string headers, index entries), and
// what a call costs whatever its keys (timer, callbacks, map nodes).
constexpr size_t kPerKeyOverhead = 64;
constexpr size_t kPerCallOverhead = 512;

}  // namespace

BlockingCalls::BlockingCalls(ServerState& state, StoreCore::ClientId client, Send send)
    : state_(state), client_(client), send_(std::move(send)) {}

BlockingCalls::~BlockingCalls() { clear(); }

size_t BlockingCalls::costOf(const wire::Request& q) {
  size_t cost = kPerCallOverhead + (q.op == wire::Op::Watch ? sizeof(KnownValue) : 0);
  for (const auto& k : q.keys) cost += 3 * (k.size() + kPerKeyOverhead);
  return cost;
}

bool BlockingCalls::start(wire::Request& q, wire::Response& p) {
  const size_t cost = costOf(q);
  Call call{q.op, q.id, std::move(q.keys), q.timeoutMs, std::nullopt, 0, nullptr, cost};
  if (call.op == wire::Op::Watch) {
    // The one comparison with the full `known`; a call that waits keeps only its digest.
    const Bytes* now = state_.core.find(call.keys[0]);
    if (now ? (!q.known || *q.known != *now) : q.known.has_value()) {
      fillReply(call, p);
      return false;
    }
    call.known = KnownValue::of(q.known);
    q.known.reset();
  }
  const uint64_t seq = ++lastSeq_;
  if (!awaitInCore(seq, call)) {
    fillReply(call, p);
    return false;
  }
  call.timer = std::make_unique<boost::asio::steady_timer>(state_.ioc);
  call.timer->expires_after(std::chrono::milliseconds(call.timeoutMs));
  call.timer->async_wait([weak = weak_from_this(), seq](boost::system::error_code ec) {
    if (ec) return;
    if (auto self = weak.lock()) self->timeOut(seq);
  });
  bytes_ += cost;
  state_.calls.add(cost);
  state_.counters.callBytes = state_.calls.used();
  calls_.emplace(seq, std::move(call));
  return true;
}

// The core calls back from inside the write that satisfied the call; the answer is built in a
// fresh handler, outside that write, where the state may have moved on (finish() re-checks).
bool BlockingCalls::awaitInCore(uint64_t seq, Call& call) {
  auto weak = weak_from_this();
  boost::asio::io_context& ioc = state_.ioc;
  auto wake = [weak, seq, &ioc] {
    boost::asio::post(ioc, [weak, seq] {
      if (auto self = weak.lock()) self->finish(seq);
    });
  };
  if (call.op == wire::Op::Watch)
    call.waiter = state_.core.watch(client_, call.keys[0], call.known,
                                    [wake](const std::optional<Bytes>&) { wake(); });
  else
    call.waiter = state_.core.waitFor(client_, call.keys, wake);
  return call.waiter != 0;
}

void BlockingCalls::fillReply(const Call& call, wire::Response& p) const {
  const StoreCore& core = state_.core;
  switch (call.op) {
    case wire::Op::Get:
    case wire::Op::MultiGet:
      for (const auto& k : call.keys) p.values.push_back(*core.find(k));
      break;
    case wire::Op::Watch:
      if (const Bytes* v = core.find(call.keys[0])) p.values.push_back(*v);
      break;
    default:
      break;
  }
}

BlockingCalls::Call BlockingCalls::take(std::unordered_map<uint64_t, Call>::iterator it) {
  Call call = std::move(it->second);
  calls_.erase(it);
  bytes_ -= call.cost;
  state_.calls.remove(call.cost);
  state_.counters.callBytes = state_.calls.used();
  return call;
}

void BlockingCalls::finish(uint64_t seq) {
  auto it = calls_.find(seq);
  if (it == calls_.end()) return;
  Call& waiting = it->second;
  const bool ready = waiting.op == wire::Op::Watch
                         ? state_.core.differs(waiting.keys[0], waiting.known)
                         : state_.core.check(waiting.keys);
  // A key was deleted again since the wake-up, or the value changed back: wait on.
  if (!ready && awaitInCore(seq, waiting)) return;
  Call call = take(it);
  call.timer->cancel();
  wire::Response p = answer(call.op, call.requestId, wire::Status::Ok);
  fillReply(call, p);
  state_.noteWaiters();
  send_(p);
}

void BlockingCalls::timeOut(uint64_t seq) {
  auto it = calls_.find(seq);
  if (it == calls_.end()) return;
  Call call = take(it);
  state_.core.cancel(call.waiter);
  state_.noteWaiters();
  wire::Response p = answer(call.op, call.requestId, wire::Status::Timeout);
  p.message = std::string(wire::toString(call.op)) + " timed out after " +
              std::to_string(call.timeoutMs) + "ms";
  p.keys = call.op == wire::Op::Watch ? call.keys : state_.core.missing(call.keys);
  send_(p);
}

void BlockingCalls::clear() {
  for (auto& [seq, call] : calls_) {
    call.timer->cancel();
    state_.core.cancel(call.waiter);
    state_.calls.remove(call.cost);
  }
  calls_.clear();
  bytes_ = 0;
  state_.counters.callBytes = state_.calls.used();
  state_.noteWaiters();
}

}  // namespace drun::rdzv::server

// Session: phases, reading, deadlines and writing. See store_session.hpp.
#include "store_session.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include "drun/common/error.hpp"

namespace drun::rdzv::server {
namespace {

// The smallest read; a frame larger than what has arrived is read in windows that double with
// the bytes received, so the buffer never holds more than twice what a peer actually sent.
constexpr size_t kReadChunk = 4096;
constexpr size_t kMaxWriteBatch = 64;  // buffers per gathered write
constexpr auto kDrainGrace = std::chrono::seconds(1);

}  // namespace

Session::Session(ServerState& state, tcp::socket socket, uint64_t id, std::string address)
    : state_(state),
      socket_(std::move(socket)),
      id_(id),
      address_(std::move(address)),
      client_(state.core.newClient()),
      writeSignal_(state.ioc),
      deadlineTimer_(state.ioc) {
  boost::system::error_code ec;
  auto remote = socket_.remote_endpoint(ec);
  peer_ = ec ? std::string("?") : remote.address().to_string() + ":" + std::to_string(remote.port());
}

Session::~Session() = default;

void Session::begin() {
  calls_ = std::make_shared<BlockingCalls>(state_, client_,
                                           [weak = weak_from_this()](const wire::Response& p) {
                                             if (auto self = weak.lock()) self->send(p);
                                           });
  boost::system::error_code ec;
  socket_.non_blocking(true, ec);  // flush()'s send returns at once when the socket is full
  lastHeard_ = Clock::now();
  handshakeDeadline_ = lastHeard_ + state_.options.handshakeTimeout;
  armDeadline();
  auto self = shared_from_this();
  auto onDone = [self](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      self->close(std::string("internal error: ") + ex.what());
    }
  };
  asio::co_spawn(state_.ioc, reader(), onDone);
  asio::co_spawn(state_.ioc, writer(), onDone);
}

bool Session::transition(SessionEvent event, const std::string& reason) {
  std::optional<SessionPhase> next = nextPhase(phase_, event);
  if (!next) {
    spdlog::error("store server: {}: event {} in phase {} ignored ({})", peer_, toString(event),
                  toString(phase_), reason);
    return false;
  }
  spdlog::debug("store server: {}: {} -> {} ({})", peer_, toString(phase_), toString(*next), reason);
  phase_ = *next;
  return true;
}

void Session::close(const std::string& reason) {
  const SessionPhase was = phase_;
  const bool flushed = was == SessionPhase::Draining && out_.empty();
  if (was == SessionPhase::Closed ||
      !transition(flushed ? SessionEvent::Flushed : SessionEvent::Drop, reason))
    return;
  if (was == SessionPhase::Auth && !state_.stopping) {
    state_.counters.authRefused++;
    spdlog::warn("store server: {} left without proving the token ({})", peer_, reason);
  }
  spdlog::debug("store server: {} closed ({}), {} call(s) pending", peer_, reason,
                calls_ ? calls_->size() : 0);
  boost::system::error_code ec;
  socket_.close(ec);
  writeSignal_.cancel();
  deadlineTimer_.cancel();
  if (calls_) calls_->clear();
  if (state_.stopping) {
    state_.core.clientGone(client_);  // nothing is served any more: waiters only
  } else if (state_.core.clientGone(client_)) {
    state_.counters.wills++;
    state_.counters.lastWillRun = std::chrono::steady_clock::now().time_since_epoch().count();
    spdlog::debug("store server: ran the will of {}", peer_);
  }
  state_.calls.remove(willBytes_);
  willBytes_ = 0;
  state_.counters.callBytes = state_.calls.used();
  state_.noteWaiters();
  state_.noteStored();
  account(0);
  state_.output.remove(outBytes_);
  state_.counters.outputQueued = state_.output.used();
  out_.clear();
  outBytes_ = 0;
  seat_.reset();
  state_.handshaking.erase(id_);
  state_.counters.pending = state_.handshaking.size();
  state_.counters.open--;
  state_.sessions.erase(id_);  // coroutines still hold `this` alive until they return
}

// ---- reading

asio::awaitable<void> Session::reader() {
  auto self = shared_from_this();
  boost::system::error_code ec;
  // Hello first: a peer that does not start with our magic is closed without a word.
  for (;;) {
    wire::Hello hello;
    auto r = wire::decodeHello(in_.data(), hello);
    if (r.status == wire::DecodeStatus::Bad) {
      state_.counters.protocolErrors++;
      close("bad hello: " + r.error);
      co_return;
    }
    if (r.status == wire::DecodeStatus::Ok) {
      in_.consume(r.consumed);
      if (!answerHello(hello)) co_return;
      break;
    }
    if (!co_await readSome(handshakeWant(r.needed), ec)) co_return;
  }
  // Then, when the server has a token, the client's proof, before anything else is read.
  while (phase_ == SessionPhase::Auth) {
    wire::Mac mac{};
    auto r = wire::decodeAuth(in_.data(), mac);
    if (r.status == wire::DecodeStatus::Ok) {
      in_.consume(r.consumed);
      if (!checkProof(mac)) co_return;
      break;
    }
    if (!co_await readSome(handshakeWant(r.needed), ec)) co_return;
  }
  size_t served = 0;  // requests since the io thread last served the others
  while (phase_ == SessionPhase::Serving) {
    size_t needed = 0;
    bool consumed = false;
    answering_ = true;  // the answers to what this read brought go out in one write (flush)
    for (;;) {
      wire::Request request;
      auto r = wire::decodeRequest(in_.data(), request, state_.wireLimits);
      if (r.status == wire::DecodeStatus::NeedMore) {
        needed = r.needed;
        break;
      }
      if (r.status == wire::DecodeStatus::Bad) {
        protocolError(r.error);
        flush();
        co_return;
      }
      in_.consume(r.consumed);
      consumed = true;
      handle(std::move(request));
      if (phase_ != SessionPhase::Serving) {
        flush();
        co_return;
      }
      if (++served >= state_.options.maxRequestsPerBatch) {
        // One busy client must not hold the io thread: let the others' handlers run.
        served = 0;
        flush();
        co_await asio::post(state_.ioc, asio::use_awaitable);
        if (phase_ != SessionPhase::Serving) co_return;
        answering_ = true;
      }
    }
    flush();
    account(in_.size());
    notePartialFrame(consumed);
    state_.noteWaiters();
    if (needed > state_.options.maxInputBytesPerConnection) {
      protocolError("frame of " + std::to_string(needed) +
                    " bytes is over this server's input budget of " +
                    std::to_string(state_.options.maxInputBytesPerConnection) +
                    " bytes per connection (maxInputBytesPerConnection)");
      co_return;
    }
    if (!co_await readSome(bytesWanted(needed), ec)) co_return;
    served = 0;  // the read yielded to the others
    if (overInputBudget()) co_return;
  }
}

// Closes this connection when its bytes take the server's buffered input over maxInputBytes.
bool Session::overInputBudget() {
  if (state_.input.used() - accounted_ + in_.size() <= state_.input.total()) return false;
  state_.counters.protocolErrors++;
  close("the server's input budget maxInputBytes of " + std::to_string(state_.input.total()) +
        " bytes is spent (" + std::to_string(in_.size()) + " bytes buffered here)");
  return true;
}

// How much to read next: a chunk, or the rest of a frame whose header is in (`needed` comes
// from the codec), but never more than has arrived so far: a peer claiming a large frame gets
// buffer space only as fast as it really sends.
size_t Session::bytesWanted(size_t needed) const {
  size_t have = in_.size();
  if (needed <= have) return kReadChunk;
  return std::clamp(needed - have, kReadChunk, std::max(kReadChunk, have));
}

// Reads of the handshake: only what the message still lacks, so that nothing of the first
// frame is taken before the client is known.
size_t Session::handshakeWant(size_t needed) const {
  size_t have = in_.size();
  return needed > have ? needed - have : wire::kHelloBytes;
}

asio::awaitable<bool> Session::readSome(size_t want, boost::system::error_code& ec) {
  char* at = in_.prepare(want);
  size_t n = co_await socket_.async_read_some(asio::buffer(at, want),
                                              asio::redirect_error(asio::use_awaitable, ec));
  if (ec || phase_ == SessionPhase::Closed) {
    if (phase_ != SessionPhase::Closed)
      close(ec == asio::error::eof ? "peer closed the connection" : "read: " + ec.message());
    co_return false;
  }
  in_.commit(n);
  lastHeard_ = Clock::now();
  co_return true;
}

// Keeps the server's total of buffered input in step with this session's.
void Session::account(size_t buffered) {
  state_.input.remove(accounted_);
  state_.input.add(buffered);
  accounted_ = buffered;
  state_.counters.inputBuffered = state_.input.used();
}

// Starts the stalled-frame clock when a frame is begun (bytes left over after the whole
// messages), stops it when nothing partial is left.
void Session::notePartialFrame(bool consumedSome) {
  if (in_.size() == 0) {
    partialSince_.reset();
  } else if (consumedSome || !partialSince_) {
    partialSince_ = Clock::now();
    armDeadline();
  }
}

void Session::protocolError(const std::string& why) {
  state_.counters.protocolErrors++;
  spdlog::debug("store server: protocol error from {}: {}", peer_, why);
  wire::Response response = answer(wire::Op::Set, 0, wire::Status::ProtocolError);
  response.message = why;  // a connection-level error: op 1, request id 0
  send(response);
  drain("protocol error: " + why);
}

// Stops reading; the writer flushes what is queued (within kDrainGrace), then closes.
void Session::drain(const std::string& reason) {
  if (!transition(SessionEvent::Refuse, reason)) return;
  drainReason_ = reason;
  lease_ = std::chrono::duration_cast<milliseconds>(kDrainGrace);
  lastHeard_ = Clock::now();
  partialSince_.reset();
  armDeadline();
  writeSignal_.cancel();
}

// ---- deadlines: one timer for the handshake, the lease, the stalled frame and the drain

Clock::time_point Session::deadline() const {
  if (isHandshake(phase_)) return handshakeDeadline_;
  Clock::time_point at = lastHeard_ + lease_;
  if (partialSince_) at = std::min(at, *partialSince_ + state_.options.stalledFrameTimeout);
  return at;
}

void Session::armDeadline() {
  deadlineTimer_.expires_at(deadline());
  deadlineTimer_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
    auto self = weak.lock();
    if (!ec && self) self->onDeadline();
  });
}

void Session::onDeadline() {
  if (phase_ == SessionPhase::Closed) return;
  const auto now = Clock::now();
  if (now < deadline()) {
    armDeadline();
    return;
  }
  const auto& o = state_.options;
  switch (phase_) {
    case SessionPhase::Hello:
    case SessionPhase::Auth:
      state_.counters.handshakesExpired++;
      close(std::string(phase_ == SessionPhase::Hello ? "no hello" : "no proof of the token") +
            " within the handshake deadline of " + std::to_string(o.handshakeTimeout.count()) +
            "ms");
      return;
    case SessionPhase::Draining:
      close(drainReason_ + " (output not flushed in time)");
      return;
    case SessionPhase::Serving:
      if (partialSince_ && now >= *partialSince_ + o.stalledFrameTimeout) {
        state_.counters.stalled++;
        spdlog::warn("store server: dropped {}: a frame was not whole {}ms after its start ({} "
                     "bytes arrived)",
                     peer_, o.stalledFrameTimeout.count(), in_.size());
        close("stalled frame");
        return;
      }
      state_.counters.leasesExpired++;
      close("lease of " + std::to_string(lease_.count()) + "ms expired");
      return;
    case SessionPhase::Closed:
      return;
  }
}

// ---- writing

// Queues a frame; a client whose unread output passes maxOutputQueueBytes is dropped, and when
// all clients' output passes maxOutputBytes, the one holding the most is.
void Session::queue(std::string frame) {
  while (phase_ != SessionPhase::Closed) {
    std::string why = state_.output.overBy(outBytes_, frame.size());
    if (why.empty()) break;
    std::shared_ptr<Session> heaviest = shared_from_this();
    if (outBytes_ + frame.size() <= state_.output.perConnection()) {
      for (auto& [id, s] : state_.sessions)
        if (s->outBytes_ > heaviest->outBytes_) heaviest = s;
    }
    state_.counters.slowDropped++;
    spdlog::warn("store server: dropped {}: output {}; it does not read its replies",
                 heaviest->peer_, why);
    heaviest->close("output queue over its limit: " + why + "; the client does not read");
  }
  if (phase_ == SessionPhase::Closed) return;
  outBytes_ += frame.size();
  state_.output.add(frame.size());
  state_.counters.outputQueued = state_.output.used();
  out_.push_back(std::move(frame));
  if (!answering_) flush();  // an answer to a blocking call, a will's wakeup: sent now
}

void Session::send(const wire::Response& response) {
  std::string frame;
  try {
    wire::encodeResponse(response, frame);
  } catch (const InvalidArgument& e) {
    wire::Response refused = answer(response.op, response.id, wire::Status::InvalidArgument);
    refused.message = e.what();
    frame.clear();
    wire::encodeResponse(refused, frame);
  }
  queue(std::move(frame));
}

asio::awaitable<void> Session::writer() {
  auto self = shared_from_this();
  boost::system::error_code ec;
  std::vector<asio::const_buffer> batch;
  while (phase_ != SessionPhase::Closed) {
    if (out_.empty()) {
      if (phase_ == SessionPhase::Draining) {
        close(drainReason_);
        co_return;
      }
      writeSignal_.expires_at(Clock::time_point::max());
      co_await writeSignal_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    batch.clear();
    size_t count = std::min(out_.size(), kMaxWriteBatch);
    size_t bytes = 0;
    for (size_t i = 0; i < count; ++i) {
      batch.push_back(asio::buffer(out_[i]));
      bytes += out_[i].size();
    }
    writing_ = true;
    co_await asio::async_write(socket_, batch, asio::redirect_error(asio::use_awaitable, ec));
    writing_ = false;
    if (phase_ == SessionPhase::Closed) co_return;
    if (ec) {
      close("write: " + ec.message());
      co_return;
    }
    written(bytes);
  }
}

// Sends the queued answers now with one gathered send(2), from the reader once it served what a
// read brought (a client's pipelined requests, a StoreBatch, get their answers in one segment),
// or from queue() for an answer that comes later: no wakeup of the writer per answer. What the
// socket does not take at once (or anything while the writer is mid-write) is the writer's.
void Session::flush() {
  answering_ = false;
  if (out_.empty() || phase_ == SessionPhase::Closed) return;
  if (!writing_) {
    flushBuffers_.clear();
    const size_t count = std::min(out_.size(), kMaxWriteBatch);
    for (size_t i = 0; i < count; ++i) flushBuffers_.push_back(asio::buffer(out_[i]));
    boost::system::error_code ec;
    const size_t n = socket_.write_some(flushBuffers_, ec);  // non-blocking (begin())
    // An error is the writer's to report (it gets it again): closing here could run a will in
    // the middle of another client's request that woke this one.
    if (!ec) written(n);
  }
  if (!out_.empty() || phase_ == SessionPhase::Draining) writeSignal_.cancel();
}

// Drops `n` bytes sent from the front of the queue (a frame sent in part keeps its rest).
void Session::written(size_t n) {
  const size_t bytes = n;
  while (n > 0) {
    std::string& front = out_.front();
    if (n < front.size()) {
      front.erase(0, n);
      break;
    }
    n -= front.size();
    out_.pop_front();
  }
  outBytes_ -= bytes;
  state_.output.remove(bytes);
  state_.counters.outputQueued = state_.output.used();
}

}  // namespace drun::rdzv::server

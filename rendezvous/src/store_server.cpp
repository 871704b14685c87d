// StoreServer: Boost.Asio, C++20 coroutines, one io thread. See store_server.hpp for the rules.
//
// Each connection is a Session with three activities on the io thread: a reader coroutine
// (hello, then frames -> StoreCore), a writer coroutine (drains the output queue) and a lease
// timer. Blocking calls become StoreCore waiters plus a deadline timer, whichever fires first
// answers the call. Nothing ever blocks on a socket, so a slow or hostile client only ever
// delays itself.
#include "drun/rendezvous/store_server.hpp"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <map>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <deque>
#include <optional>
#include <thread>
#include <unordered_map>

#include "drun/common/error.hpp"
#include "drun/common/safe_text.hpp"
#include "drun/rendezvous/protocol.hpp"
#include "drun/rendezvous/store_core.hpp"

namespace drun::rdzv {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// The smallest read; a frame larger than what has arrived is read in windows that double with
// the bytes received, so the buffer never holds more than twice what a peer actually sent.
constexpr size_t kReadChunk = 4096;
// A refused connection gets its Busy reply and is closed after this (or at the peer's EOF); at
// most kMaxRefusing are kept that long, the others are closed at once.
constexpr auto kRefuseLinger = std::chrono::milliseconds(500);
constexpr size_t kMaxRefusing = 64;
constexpr size_t kMaxWriteBatch = 64;  // buffers per gathered write
constexpr auto kDrainGrace = std::chrono::seconds(1);

void raiseFileLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur >= limit.rlim_max) return;
  rlimit raised = limit;
  raised.rlim_cur = limit.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &raised) == 0)
    spdlog::debug("store server: RLIMIT_NOFILE soft limit {} -> {}", limit.rlim_cur,
                  raised.rlim_cur);
}

uint32_t clampMs(milliseconds ms) {
  if (ms.count() <= 0) return 0;
  if (ms.count() >= 0xffffffffLL) return 0xffffffffu;
  return static_cast<uint32_t>(ms.count());
}

wire::Response answer(wire::Op op, uint64_t id, wire::Status status) {
  wire::Response r;
  r.op = op;
  r.id = id;
  r.status = status;
  return r;
}

struct Counters {
  std::atomic<uint64_t> accepted{0}, open{0}, requests{0}, protocolErrors{0}, leasesExpired{0},
      slowDropped{0}, wills{0}, waiters{0}, orphansRemoved{0}, refused{0}, stalled{0},
      inputBuffered{0}, authRefused{0};
};

}  // namespace

class StoreServer::Impl {
 public:
  class Session;

  explicit Impl(const StoreServerOptions& options);
  void start();
  void run();
  void stop();

  StoreServerOptions options_;
  wire::Limits wireLimits_;
  asio::io_context ioc_;
  tcp::acceptor acceptor_{ioc_};
  asio::steady_timer acceptRetry_{ioc_};
  uint16_t port_ = 0;
  StoreCore core_;
  std::unordered_map<uint64_t, std::shared_ptr<Session>> sessions_;  // io thread only
  std::unordered_map<std::string, size_t> perPeer_;  // open sessions by peer address; io thread
  size_t inputBytes_ = 0;  // buffered input of all sessions; io thread only
  size_t refusing_ = 0;    // refused connections lingering; io thread only
  uint64_t lastSession_ = 0;
  bool stopping_ = false;  // io thread only
  std::atomic<bool> stopRequested_{false};
  std::atomic<bool> running_{false};
  std::thread thread_;
  std::thread::id ioThread_;
  Counters counters_;

  asio::steady_timer sweepTimer_{ioc_};
  std::map<std::string, std::chrono::steady_clock::time_point> orphanSince_;  // io thread only

  asio::awaitable<void> acceptLoop();
  std::string refusal(const std::string& address) const;
  asio::awaitable<void> refuse(tcp::socket socket);
  asio::awaitable<void> sweepLoop();
  void sweepOrphans();
  void noteWaiters() { counters_.waiters = core_.waiterCount(); }
  void closeAll();
};

// ------------------------------------------------------------------------------------- Session

class StoreServer::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Impl& server, tcp::socket socket, uint64_t id, std::string address)
      : server_(server),
        socket_(std::move(socket)),
        id_(id),
        address_(std::move(address)),
        client_(server.core_.newClient()),
        writeSignal_(server.ioc_),
        leaseTimer_(server.ioc_) {
    boost::system::error_code ec;
    auto remote = socket_.remote_endpoint(ec);
    peer_ = ec ? std::string("?") : remote.address().to_string() + ":" + std::to_string(remote.port());
  }

  void begin() {
    lastHeard_ = Clock::now();
    lease_ = server_.options_.handshakeTimeout;
    armLease();
    auto self = shared_from_this();
    auto onDone = [self](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        self->close(std::string("internal error: ") + ex.what());
      }
    };
    asio::co_spawn(server_.ioc_, reader(), onDone);
    asio::co_spawn(server_.ioc_, writer(), onDone);
  }

  // Closes the connection now; drops the waiters, runs the will (unless the server is stopping).
  void close(const std::string& reason) {
    if (closed_) return;
    closed_ = true;
    if (tokenRequired_ && !authenticated_ && !draining_ && !server_.stopping_) {
      server_.counters_.authRefused++;
      spdlog::warn("store server: {} left without proving the token ({})", peer_, reason);
    }
    spdlog::debug("store server: {} closed ({}), {} call(s) pending", peer_, reason,
                  pending_.size());
    boost::system::error_code ec;
    socket_.close(ec);
    writeSignal_.cancel();
    leaseTimer_.cancel();
    for (auto& [seq, call] : pending_) call.timer->cancel();
    pending_.clear();
    if (server_.stopping_) {
      server_.core_.clientGone(client_);  // nothing is served any more: waiters only
    } else if (server_.core_.clientGone(client_)) {
      server_.counters_.wills++;
      spdlog::debug("store server: ran the will of {}", peer_);
    }
    server_.noteWaiters();
    account(0);
    server_.counters_.open--;
    if (auto it = server_.perPeer_.find(address_); it != server_.perPeer_.end() && --it->second == 0)
      server_.perPeer_.erase(it);
    server_.sessions_.erase(id_);  // coroutines still hold `this` alive until they return
  }

 private:
  struct PendingCall {
    wire::Op op;
    uint64_t requestId;
    std::vector<std::string> keys;
    uint32_t timeoutMs;
    StoreCore::WaiterId waiter = 0;
    std::unique_ptr<asio::steady_timer> timer;
  };

  // ---- reading

  asio::awaitable<void> reader() {
    auto self = shared_from_this();
    boost::system::error_code ec;
    // Hello first: a peer that does not start with our magic is closed without a word.
    for (;;) {
      wire::Hello hello;
      auto r = wire::decodeHello(in_.data(), hello);
      if (r.status == wire::DecodeStatus::Bad) {
        server_.counters_.protocolErrors++;
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
    while (tokenRequired_ && !authenticated_) {
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
    while (!closed_ && !draining_) {
      size_t needed = 0;
      bool consumed = false;
      for (;;) {
        wire::Request request;
        auto r = wire::decodeRequest(in_.data(), request, server_.wireLimits_);
        if (r.status == wire::DecodeStatus::NeedMore) {
          needed = r.needed;
          break;
        }
        if (r.status == wire::DecodeStatus::Bad) {
          protocolError(r.error);
          co_return;
        }
        in_.consume(r.consumed);
        consumed = true;
        handle(std::move(request));
        if (closed_ || draining_) co_return;
        if (++served >= server_.options_.maxRequestsPerBatch) {
          // One busy client must not hold the io thread: let the others' handlers run.
          served = 0;
          co_await asio::post(server_.ioc_, asio::use_awaitable);
          if (closed_ || draining_) co_return;
        }
      }
      account(in_.size());
      notePartialFrame(consumed);
      server_.noteWaiters();
      if (needed > server_.options_.maxInputBytesPerConnection) {
        protocolError("frame of " + std::to_string(needed) +
                      " bytes is over this server's input budget of " +
                      std::to_string(server_.options_.maxInputBytesPerConnection) +
                      " bytes per connection");
        co_return;
      }
      if (!co_await readSome(bytesWanted(needed), ec)) co_return;
      served = 0;  // the read yielded to the others
      if (server_.inputBytes_ + in_.size() - accounted_ > server_.options_.maxInputBytes) {
        server_.counters_.protocolErrors++;
        close("the server's input budget of " + std::to_string(server_.options_.maxInputBytes) +
              " bytes is spent (" + std::to_string(in_.size()) + " bytes buffered here)");
        co_return;
      }
    }
  }

  // How much to read next: a chunk, or the rest of a frame whose header is in (`needed` comes
  // from the codec), but never more than has arrived so far: a peer claiming a large frame gets
  // buffer space only as fast as it really sends.
  size_t bytesWanted(size_t needed) const {
    size_t have = in_.size();
    if (needed <= have) return kReadChunk;
    return std::clamp(needed - have, kReadChunk, std::max(kReadChunk, have));
  }

  asio::awaitable<bool> readSome(size_t want, boost::system::error_code& ec) {
    char* at = in_.prepare(want);
    size_t n = co_await socket_.async_read_some(asio::buffer(at, want),
                                                asio::redirect_error(asio::use_awaitable, ec));
    if (ec || closed_) {
      if (!closed_)
        close(ec == asio::error::eof ? "peer closed the connection" : "read: " + ec.message());
      co_return false;
    }
    in_.commit(n);
    lastHeard_ = Clock::now();
    co_return true;
  }

  // Keeps the server's total of buffered input in step with this session's.
  void account(size_t buffered) {
    server_.inputBytes_ = server_.inputBytes_ - accounted_ + buffered;
    accounted_ = buffered;
    server_.counters_.inputBuffered = server_.inputBytes_;
  }

  // Starts the stalled-frame clock when a frame is begun (bytes left over after the whole
  // messages), stops it when nothing partial is left.
  void notePartialFrame(bool consumedSome) {
    if (in_.size() == 0) {
      partialSince_.reset();
    } else if (consumedSome || !partialSince_) {
      partialSince_ = Clock::now();
      armLease();
    }
  }

  // Reads of the handshake: only what the message still lacks, so that nothing of the first
  // frame is taken before the client is known.
  size_t handshakeWant(size_t needed) const {
    size_t have = in_.size();
    return needed > have ? needed - have : wire::kHelloBytes;
  }

  bool answerHello(const wire::Hello& hello) {
    wire::HelloReply reply;
    if (hello.version != wire::kVersion) {
      reply.status = wire::HelloStatus::VersionMismatch;
      std::string out;
      wire::encodeHelloReply(reply, out);
      queue(std::move(out));
      spdlog::warn("store server: refused {}: it speaks protocol version {}, this server {}",
                   peer_, hello.version, wire::kVersion);
      drain("client speaks protocol version " + std::to_string(hello.version));
      return false;
    }
    const auto& o = server_.options_;
    milliseconds lease = hello.leaseMs == 0 ? o.leaseTimeout : milliseconds(hello.leaseMs);
    lease = std::clamp(lease, o.minLeaseTimeout, o.maxLeaseTimeout);
    reply.leaseMs = clampMs(lease);
    scope_ = hello.scope;
    clientNonce_ = hello.nonce;
    tokenRequired_ = !o.token.empty() || !o.jobTokens.empty();
    if (auto job = o.jobTokens.find(scope_); !scope_.empty() && job != o.jobTokens.end()) {
      token_ = job->second;
      keyPrefix_ = o.orphanRoot + scope_ + "/";
    } else {
      token_ = o.token;  // empty with jobTokens only: no proof can succeed
    }
    if (tokenRequired_) {
      serverNonce_ = wire::randomNonce();
      reply.nonce = serverNonce_;
      reply.tokenRequired = true;
      pendingLease_ = lease;  // granted once the proof is in; until then the handshake deadline
    } else {
      lease_ = lease;
      armLease();  // from the handshake deadline to the client's lease
    }
    std::string out;
    wire::encodeHelloReply(reply, out);
    queue(std::move(out));
    spdlog::debug("store server: {} connected (lease {}ms, job '{}', token {})", peer_,
                  lease.count(), scope_, tokenRequired_ ? "required" : "none");
    return true;
  }

  // The client's proof of the token: the connection goes on with the lease it asked for, or is
  // refused (logged, counted) and closed once told.
  bool checkProof(const wire::Mac& mac) {
    wire::AuthReply reply;
    const bool ok = !token_.empty() &&
                    wire::equalMacs(mac, wire::clientProof(token_, clientNonce_, serverNonce_, scope_));
    if (ok) {
      authenticated_ = true;
      reply.mac = wire::serverProof(token_, clientNonce_, serverNonce_, scope_);
      lease_ = pendingLease_;
      armLease();
    } else {
      reply.status = wire::AuthStatus::Refused;
      server_.counters_.authRefused++;
    }
    std::string out;
    wire::encodeAuthReply(reply, out);
    queue(std::move(out));
    if (ok) return true;
    const std::string why =
        token_.empty() ? "no token on this server for job '" + printableScope() + "'"
                       : "wrong token" + (scope_.empty() ? "" : " for job '" + printableScope() + "'");
    spdlog::warn("store server: refused {}: {}", peer_, why);
    drain("refused: " + why);
    return false;
  }

  std::string printableScope() const { return text::printable(scope_, {wire::kMaxScopeBytes}); }

  // Why request `q` is outside the keys this connection may touch ("" = it is not).
  std::string outOfScope(const wire::Request& q) const {
    if (keyPrefix_.empty()) return "";
    const std::string job = "a client of job '" + printableScope() + "'";
    if (q.op == wire::Op::NumKeys) return job + " cannot count the whole store";
    auto inside = [&](const std::string& key) { return key.starts_with(keyPrefix_); };
    auto outside = [&](const std::string& key) {
      return job + " may only touch keys under " + keyPrefix_ + ", not " +
             text::printable(key, {128});
    };
    for (const auto& k : q.keys)
      if (!inside(k)) return outside(k);
    for (const auto& [k, v] : q.will.sets)
      if (!inside(k)) return outside(k);
    for (const auto& [k, d] : q.will.adds)
      if (!inside(k)) return outside(k);
    for (const auto& k : q.will.deletes)
      if (!inside(k)) return outside(k);
    return "";
  }

  void protocolError(const std::string& why) {
    server_.counters_.protocolErrors++;
    spdlog::debug("store server: protocol error from {}: {}", peer_, why);
    wire::Response response;
    response.op = wire::Op::Set;  // a connection-level error: op 1, request id 0
    response.id = 0;
    response.status = wire::Status::ProtocolError;
    response.message = why;
    send(response);
    drain("protocol error: " + why);
  }

  // Stops reading; the writer flushes what is queued (within kDrainGrace), then closes.
  void drain(const std::string& reason) {
    if (draining_ || closed_) return;
    draining_ = true;
    drainReason_ = reason;
    lease_ = std::chrono::duration_cast<milliseconds>(kDrainGrace);
    lastHeard_ = Clock::now();
    partialSince_.reset();
    armLease();
    writeSignal_.cancel();
  }

  // ---- the lease

  // The lease and the stalled-frame deadline share one timer: whichever comes first.
  Clock::time_point leaseDeadline() const {
    Clock::time_point at = lastHeard_ + lease_;
    if (partialSince_) at = std::min(at, *partialSince_ + server_.options_.stalledFrameTimeout);
    return at;
  }

  void armLease() {
    leaseTimer_.expires_at(leaseDeadline());
    leaseTimer_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->closed_) return;
      if (Clock::now() < self->leaseDeadline()) {
        self->armLease();
        return;
      }
      if (self->draining_) {
        self->close(self->drainReason_ + " (output not flushed in time)");
        return;
      }
      const auto& o = self->server_.options_;
      if (self->partialSince_ && Clock::now() >= *self->partialSince_ + o.stalledFrameTimeout) {
        self->server_.counters_.stalled++;
        spdlog::warn("store server: dropped {}: a frame was not whole {}ms after its start ({} "
                     "bytes arrived)",
                     self->peer_, o.stalledFrameTimeout.count(), self->in_.size());
        self->close("stalled frame");
        return;
      }
      self->server_.counters_.leasesExpired++;
      self->close("lease of " + std::to_string(self->lease_.count()) + "ms expired");
    });
  }

  // ---- writing

  void queue(std::string frame) {
    if (closed_) return;
    outBytes_ += frame.size();
    out_.push_back(std::move(frame));
    if (outBytes_ > server_.options_.maxOutputQueueBytes && !dropping_) {
      // The client does not read its replies. Close outside the current call chain: we may be
      // inside a StoreCore write waking this session's waiter.
      dropping_ = true;
      server_.counters_.slowDropped++;
      asio::post(server_.ioc_, [self = shared_from_this()] {
        self->close("output queue over " + std::to_string(self->server_.options_.maxOutputQueueBytes) +
                    " bytes: client does not read");
      });
      return;
    }
    writeSignal_.cancel();
  }

  void send(const wire::Response& response) {
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

  asio::awaitable<void> writer() {
    auto self = shared_from_this();
    boost::system::error_code ec;
    std::vector<asio::const_buffer> batch;
    while (!closed_) {
      if (out_.empty()) {
        if (draining_) {
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
      co_await asio::async_write(socket_, batch, asio::redirect_error(asio::use_awaitable, ec));
      if (closed_) co_return;
      if (ec) {
        close("write: " + ec.message());
        co_return;
      }
      for (size_t i = 0; i < count; ++i) out_.pop_front();
      outBytes_ -= bytes;
    }
  }

  // ---- requests

  void handle(wire::Request q) {
    server_.counters_.requests++;
    if (q.op == wire::Op::Heartbeat) return;  // reading it renewed the lease
    wire::Response p = answer(q.op, q.id, wire::Status::Ok);
    if (std::string why = outOfScope(q); !why.empty()) {
      p = answer(q.op, q.id, wire::Status::InvalidArgument);
      p.message = why;
      send(p);
      return;
    }
    StoreCore& core = server_.core_;
    try {
      switch (q.op) {
        case wire::Op::Set:
          core.set(q.keys[0], std::move(q.values[0]));
          break;
        case wire::Op::TryGet:
          if (const Bytes* v = core.find(q.keys[0])) p.values.push_back(*v);
          break;
        case wire::Op::Add:
          p.number = core.add(q.keys[0], q.delta);
          break;
        case wire::Op::CompareSet:
          p.values.push_back(core.compareSet(q.keys[0], q.values[0], std::move(q.values[1])));
          break;
        case wire::Op::Check:
          p.number = core.check(q.keys) ? 1 : 0;
          break;
        case wire::Op::Delete:
          p.number = core.erase(q.keys[0]) ? 1 : 0;
          break;
        case wire::Op::NumKeys:
          p.number = core.numKeys();
          break;
        case wire::Op::MultiSet:
          core.multiSet(q.keys, q.values);
          break;
        case wire::Op::Append:
          core.append(q.keys[0], q.values[0]);
          break;
        case wire::Op::SetWill:
          core.setWill(client_, std::move(q.will));
          break;
        case wire::Op::DeletePrefix:
          p.number = core.erasePrefix(q.keys[0]);
          break;
        case wire::Op::Get:
        case wire::Op::Wait:
        case wire::Op::MultiGet:
        case wire::Op::Watch:
          if (startBlocking(q)) return;  // answered later (or at its deadline)
          fillBlockingReply(q.op, q.keys, p, std::nullopt);
          break;
        case wire::Op::Heartbeat:
          return;
      }
    } catch (const InvalidArgument& e) {
      p = answer(q.op, q.id, wire::Status::InvalidArgument);
      p.message = e.what();
    } catch (const std::exception& e) {
      p = answer(q.op, q.id, wire::Status::ServerError);
      p.message = e.what();
    }
    send(p);
  }

  // Registers the waiter and the deadline; false when the call can be answered at once.
  bool startBlocking(wire::Request& q) {
    const size_t maxWaiters = server_.options_.maxWaitersPerConnection;
    if (pending_.size() >= maxWaiters)
      throw InvalidArgument("over " + std::to_string(maxWaiters) +
                            " blocking calls pending on one connection");
    uint64_t seq = ++lastPending_;
    StoreCore::WaiterId waiter = 0;
    if (!awaitInCore(seq, q.op, q.keys, q.known, waiter)) return false;
    PendingCall call{q.op, q.id, std::move(q.keys), q.timeoutMs, waiter,
                     std::make_unique<asio::steady_timer>(server_.ioc_)};
    call.timer->expires_after(milliseconds(q.timeoutMs));
    call.timer->async_wait([weak = weak_from_this(), seq](boost::system::error_code ec) {
      if (ec) return;
      if (auto self = weak.lock()) self->timeoutPending(seq);
    });
    pending_.emplace(seq, std::move(call));
    return true;
  }

  // Registers pending call `seq` as a StoreCore waiter; false when it is satisfied already.
  // The core calls back from inside the write that satisfied it; the answer is built in a fresh
  // handler, outside that write, where the state may have moved on (finishPending re-checks).
  bool awaitInCore(uint64_t seq, wire::Op op, const std::vector<std::string>& keys,
                   const std::optional<Bytes>& known, StoreCore::WaiterId& waiter) {
    StoreCore& core = server_.core_;
    auto weak = weak_from_this();
    asio::io_context& ioc = server_.ioc_;
    if (op == wire::Op::Watch) {
      waiter = core.watch(client_, keys[0], known,
                          [weak, seq, &ioc](const std::optional<Bytes>& value) {
                            asio::post(ioc, [weak, seq, value] {
                              if (auto self = weak.lock()) self->finishPending(seq, value);
                            });
                          });
    } else {
      waiter = core.waitFor(client_, keys, [weak, seq, &ioc] {
        asio::post(ioc, [weak, seq] {
          if (auto self = weak.lock()) self->finishPending(seq, std::nullopt);
        });
      });
    }
    return waiter != 0;
  }

  void fillBlockingReply(wire::Op op, const std::vector<std::string>& keys, wire::Response& p,
                         const std::optional<Bytes>& watched) {
    const StoreCore& core = server_.core_;
    switch (op) {
      case wire::Op::Get:
      case wire::Op::MultiGet:
        for (const auto& k : keys) p.values.push_back(*core.find(k));
        break;
      case wire::Op::Watch:
        if (watched) {
          p.values.push_back(*watched);
        } else if (const Bytes* v = core.find(keys[0])) {
          p.values.push_back(*v);
        }
        break;
      default:
        break;
    }
  }

  void finishPending(uint64_t seq, const std::optional<Bytes>& watched) {
    auto it = pending_.find(seq);
    if (it == pending_.end() || closed_) return;
    if (it->second.op != wire::Op::Watch && !server_.core_.check(it->second.keys)) {
      // A key was deleted again since the wake-up (by a will, by another client): wait on.
      StoreCore::WaiterId waiter = 0;
      if (awaitInCore(seq, it->second.op, it->second.keys, std::nullopt, waiter)) {
        it->second.waiter = waiter;
        return;
      }
    }
    PendingCall call = std::move(it->second);
    pending_.erase(it);
    call.timer->cancel();
    wire::Response p = answer(call.op, call.requestId, wire::Status::Ok);
    fillBlockingReply(call.op, call.keys, p, watched);
    send(p);
    server_.noteWaiters();
  }

  void timeoutPending(uint64_t seq) {
    auto it = pending_.find(seq);
    if (it == pending_.end() || closed_) return;
    PendingCall call = std::move(it->second);
    pending_.erase(it);
    server_.core_.cancel(call.waiter);
    server_.noteWaiters();
    wire::Response p = answer(call.op, call.requestId, wire::Status::Timeout);
    p.message = std::string(wire::toString(call.op)) + " timed out after " +
                std::to_string(call.timeoutMs) + "ms";
    p.keys = call.op == wire::Op::Watch ? call.keys : server_.core_.missing(call.keys);
    send(p);
  }

  Impl& server_;
  tcp::socket socket_;
  uint64_t id_;
  std::string address_;  // the peer's address, for the per-peer connection count
  std::string scope_;      // the run id the client named in its hello
  std::string keyPrefix_;  // with a job's own token: the only keys it may touch ("" = all)
  std::string token_;      // what this client must prove ("" with tokenRequired_: nothing can)
  bool tokenRequired_ = false;
  bool authenticated_ = false;
  milliseconds pendingLease_{0};
  wire::Nonce clientNonce_{}, serverNonce_{};
  StoreCore::ClientId client_;
  std::string peer_;
  wire::ReceiveBuffer in_;
  size_t accounted_ = 0;  // in_.size() as last counted in the server's inputBytes_
  std::optional<Clock::time_point> partialSince_;  // when the frame being received began
  std::deque<std::string> out_;
  size_t outBytes_ = 0;
  asio::steady_timer writeSignal_;  // cancelled to wake the writer
  asio::steady_timer leaseTimer_;
  Clock::time_point lastHeard_;
  milliseconds lease_{0};
  bool closed_ = false;
  bool draining_ = false;
  bool dropping_ = false;
  std::string drainReason_;
  std::unordered_map<uint64_t, PendingCall> pending_;
  uint64_t lastPending_ = 0;
};

// ---------------------------------------------------------------------------------------- Impl

StoreServer::Impl::Impl(const StoreServerOptions& options)
    : options_(options), core_(options.limits) {
  wireLimits_.store = options_.limits;
  wireLimits_.maxFrameBytes = options_.maxFrameBytes;
  raiseFileLimit();
  std::string host = options_.host.empty() ? "0.0.0.0" : options_.host;
  std::string where = host + ":" + std::to_string(options_.port);
  try {
    tcp::resolver resolver(ioc_);
    auto results = resolver.resolve(host, std::to_string(options_.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service);
    if (results.empty()) throw NetworkError("store server: cannot resolve " + where);
    tcp::endpoint endpoint = results.begin()->endpoint();
    acceptor_.open(endpoint.protocol());
    acceptor_.set_option(tcp::acceptor::reuse_address(true));
    acceptor_.bind(endpoint);
    acceptor_.listen(asio::socket_base::max_listen_connections);
    port_ = acceptor_.local_endpoint().port();
  } catch (const boost::system::system_error& e) {
    throw NetworkError("store server: cannot listen on " + where + ": " + e.code().message());
  }
  auto report = [](const char* what) {
    return [what](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        spdlog::error("store server: {} failed: {}", what, ex.what());
      }
    };
  };
  asio::co_spawn(ioc_, acceptLoop(), report("accept loop"));
  if (options_.orphanTtl.count() > 0) asio::co_spawn(ioc_, sweepLoop(), report("orphan sweep"));
}

// Removes the jobs no agent's will has named for orphanTtl (all their agents died); runs on the
// io thread every quarter of the TTL.
asio::awaitable<void> StoreServer::Impl::sweepLoop() {
  const auto period = std::max<milliseconds>(milliseconds(50), options_.orphanTtl / 4);
  boost::system::error_code ec;
  while (!stopping_) {
    sweepTimer_.expires_after(period);
    co_await sweepTimer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (stopping_) co_return;
    sweepOrphans();
  }
}

void StoreServer::Impl::sweepOrphans() {
  const auto now = std::chrono::steady_clock::now();
  std::map<std::string, std::chrono::steady_clock::time_point> still;
  for (std::string& job : core_.prefixesWithoutWill(options_.orphanRoot)) {
    auto since = orphanSince_.count(job) ? orphanSince_[job] : now;
    if (now - since < options_.orphanTtl) {
      still.emplace(std::move(job), since);
      continue;
    }
    const int64_t removed = core_.erasePrefix(job);
    counters_.orphansRemoved++;
    noteWaiters();
    spdlog::info("store server: removed {} key(s) of {} (no agent of it left for {}ms)", removed,
                 job, options_.orphanTtl.count());
  }
  orphanSince_ = std::move(still);
}

asio::awaitable<void> StoreServer::Impl::acceptLoop() {
  boost::system::error_code ec;
  while (!stopping_) {
    tcp::socket socket(ioc_);
    co_await acceptor_.async_accept(socket, asio::redirect_error(asio::use_awaitable, ec));
    if (stopping_) co_return;
    if (ec) {
      // Out of descriptors or a transient network error: back off instead of spinning; the
      // connections already open are unaffected.
      spdlog::warn("store server: accept on port {} failed: {}; retrying", port_, ec.message());
      acceptRetry_.expires_after(std::chrono::milliseconds(50));
      co_await acceptRetry_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);
    auto remote = socket.remote_endpoint(ec);
    std::string address = ec ? std::string("?") : remote.address().to_string();
    if (std::string why = refusal(address); !why.empty()) {
      counters_.refused++;
      spdlog::warn("store server: refused a connection from {}: {}", address, why);
      if (refusing_ < kMaxRefusing) {
        asio::co_spawn(ioc_, refuse(std::move(socket)), asio::detached);
      } else {
        socket.close(ec);
      }
      continue;
    }
    counters_.accepted++;
    counters_.open++;
    perPeer_[address]++;
    uint64_t id = ++lastSession_;
    auto session = std::make_shared<Session>(*this, std::move(socket), id, address);
    sessions_.emplace(id, session);
    session->begin();
  }
}

// Why a new connection from `address` is over a limit ("" = it is not).
std::string StoreServer::Impl::refusal(const std::string& address) const {
  if (sessions_.size() >= options_.maxConnections)
    return "at the limit of " + std::to_string(options_.maxConnections) + " connections";
  auto it = perPeer_.find(address);
  if (it != perPeer_.end() && it->second >= options_.maxConnectionsPerPeer)
    return "at the limit of " + std::to_string(options_.maxConnectionsPerPeer) +
           " connections from one address";
  return "";
}

// Tells a refused peer why (HelloStatus::Busy), then closes once it has read it: closing with
// its hello unread would reset the connection and lose the reply.
asio::awaitable<void> StoreServer::Impl::refuse(tcp::socket socket) {
  refusing_++;
  auto sock = std::make_shared<tcp::socket>(std::move(socket));
  asio::steady_timer linger(ioc_);
  linger.expires_after(kRefuseLinger);
  linger.async_wait([sock](boost::system::error_code ec) {
    if (!ec) sock->close(ec);
  });
  boost::system::error_code ec;
  try {
    wire::HelloReply reply;
    reply.status = wire::HelloStatus::Busy;
    std::string out;
    wire::encodeHelloReply(reply, out);
    co_await asio::async_write(*sock, asio::buffer(out),
                               asio::redirect_error(asio::use_awaitable, ec));
    if (!ec) sock->shutdown(tcp::socket::shutdown_send, ec);
    char sink[512];
    for (int i = 0; i < 64 && !ec && sock->is_open(); ++i)
      co_await sock->async_read_some(asio::buffer(sink),
                                     asio::redirect_error(asio::use_awaitable, ec));
  } catch (const std::exception&) {
    // Nothing to tell: the connection is closed below either way.
  }
  linger.cancel();
  sock->close(ec);
  refusing_--;
}

void StoreServer::Impl::closeAll() {
  stopping_ = true;
  boost::system::error_code ec;
  acceptor_.close(ec);
  acceptRetry_.cancel();
  sweepTimer_.cancel();
  std::vector<std::shared_ptr<Session>> all;
  for (auto& [id, s] : sessions_) all.push_back(s);
  for (auto& s : all) s->close("server stopping");
}

void StoreServer::Impl::start() {
  if (running_.exchange(true)) throw std::logic_error("StoreServer already running");
  thread_ = std::thread([this] {
    ioThread_ = std::this_thread::get_id();
    ioc_.run();
  });
}

void StoreServer::Impl::run() {
  if (running_.exchange(true)) throw std::logic_error("StoreServer already running");
  ioThread_ = std::this_thread::get_id();
  ioc_.run();
}

void StoreServer::Impl::stop() {
  if (!stopRequested_.exchange(true)) {
    if (running_) {
      asio::post(ioc_, [this] { closeAll(); });
    } else {
      closeAll();  // never served: nothing runs concurrently
      ioc_.run();  // let the cancelled accept loop finish
    }
  }
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
}

// ---------------------------------------------------------------------------------- StoreServer

StoreServer::StoreServer(const StoreServerOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}

StoreServer::~StoreServer() { stop(); }

uint16_t StoreServer::port() const { return impl_->port_; }
const std::string& StoreServer::host() const { return impl_->options_.host; }
void StoreServer::start() { impl_->start(); }
void StoreServer::run() { impl_->run(); }
void StoreServer::stop() { impl_->stop(); }

StoreServerStats StoreServer::stats() const {
  const Counters& c = impl_->counters_;
  StoreServerStats s;
  s.connectionsAccepted = c.accepted;
  s.connectionsOpen = c.open;
  s.requestsServed = c.requests;
  s.protocolErrors = c.protocolErrors;
  s.leasesExpired = c.leasesExpired;
  s.slowClientsDropped = c.slowDropped;
  s.willsRun = c.wills;
  s.waitersPending = c.waiters;
  s.orphanJobsRemoved = c.orphansRemoved;
  s.connectionsRefused = c.refused;
  s.stalledDropped = c.stalled;
  s.inputBytesBuffered = c.inputBuffered;
  s.authRefused = c.authRefused;
  return s;
}

}  // namespace drun::rdzv

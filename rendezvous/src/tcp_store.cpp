// TcpStore: blocking client of StoreServer over POSIX sockets; every wait is a poll() with the
// call's deadline. See tcp_store.hpp for the rules.
#include "drun/rendezvous/tcp_store.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "drun/common/deadline.hpp"
#include "drun/common/error.hpp"
#include "drun/common/resolve.hpp"
#include "drun/common/safe_text.hpp"
#include "drun/rendezvous/protocol.hpp"
#include "drun/rendezvous/store_batch.hpp"

namespace drun::rdzv {
namespace {

using wire::Op;

// How much longer than the server's deadline the client waits for the server's timeout answer
// to a blocking call, so that the answer (not our own deadline) normally ends the call.
milliseconds replyGrace(milliseconds timeout) {
  return std::clamp(timeout / 10, milliseconds(500), milliseconds(5000));
}

constexpr milliseconds kMaxWireTimeout{0xfffffffeLL};

milliseconds clampTimeout(milliseconds t) { return std::clamp(t, milliseconds(0), kMaxWireTimeout); }

// An error text the server sent: it may quote a stored value another client wrote (escape
// sequences, a 4 KiB line): printed as it came, it could rewrite the user's terminal.
std::string serverText(const std::string& message) { return text::printable(message); }

std::string keyList(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i) out += ", ";
    out += text::printable(keys[i], {128});  // keys of a Timeout reply come from the server
    if (out.size() > 1024 && i + 1 < keys.size()) {
      out += ", ... (" + std::to_string(keys.size() - i - 1) + " more)";
      break;
    }
  }
  return out + "]";
}

std::string errnoText(int err) { return std::strerror(err); }

// Waits for `events` on fd until the deadline; false on timeout.
// After this process was stopped and continued (SIGSTOP/SIGCONT: a debugger, a loaded node,
// the chaos driver), a deadline may have passed while nothing here ran — nor the store server's
// thread, when this process hosts it. poll() then returns a plain timeout (EINTR only at times),
// so the stop is seen by the clock: poll() waits in slices of kStallProbe, and one that returns
// kStallSlack later than asked means this process did not run meanwhile. Such a deadline gets
// kGraceAfterStop more, once, so that the peer can answer before the connection is declared lost.
constexpr milliseconds kGraceAfterStop{500};
constexpr milliseconds kStallProbe{250};
constexpr milliseconds kStallSlack{250};

bool pollUntil(int fd, short events, const Deadline& callDeadline) {
  using Clock = std::chrono::steady_clock;
  Deadline deadline = callDeadline;
  bool stopped = false;  // this process (perhaps) did not run for a while during the call
  bool graced = false;
  for (;;) {
    const milliseconds slice = std::min(deadline.remaining(), kStallProbe);
    pollfd p{fd, events, 0};
    const auto before = Clock::now();
    int n = ::poll(&p, 1, static_cast<int>(slice.count()));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) throw NetworkError(std::string("poll: ") + errnoText(errno));
    if (n < 0 || Clock::now() - before > slice + kStallSlack) stopped = true;
    if (deadline.expired()) {
      if (!stopped || graced) return false;
      graced = true;
      deadline = Deadline(kGraceAfterStop);
    }
  }
}

}  // namespace

// ------------------------------------------------------------------------------------ Connection

class TcpStore::Connection {
 public:
  explicit Connection(const TcpStoreOptions& options)
      : options_(options), endpoint_(options.host + ":" + std::to_string(options.port)) {
    if (options_.heartbeatInterval.count() > 0 && options_.leaseTimeout.count() > 0 &&
        options_.heartbeatInterval >= options_.leaseTimeout)
      throw InvalidArgument("TcpStore: heartbeatInterval (" +
                            std::to_string(options_.heartbeatInterval.count()) +
                            "ms) must be shorter than leaseTimeout (" +
                            std::to_string(options_.leaseTimeout.count()) + "ms)");
    Deadline deadline(clampTimeout(options_.connectTimeout));
    connectWithRetries(deadline);
    try {
      handshake(deadline);
    } catch (...) {
      ::close(fd_);
      throw;
    }
    if (options_.heartbeatInterval.count() > 0)
      heartbeat_ = std::thread([this] { heartbeatLoop(); });
  }

  ~Connection() {
    stopHeartbeats();
    ::close(fd_);
  }

  const std::string& endpoint() const { return endpoint_; }
  milliseconds lease() const { return lease_; }

  // shutdown(2), not close(2): the fd stays valid for a reader blocked on it in another thread,
  // which wakes up to EOF and reports the connection broken.
  void interrupt() { ::shutdown(fd_, SHUT_RDWR); }

  void stopHeartbeats() {
    {
      std::lock_guard lock(heartbeatMutex_);
      stopHeartbeat_ = true;
    }
    heartbeatCv_.notify_all();
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  // Sends the request and returns its (Ok) response; error statuses become exceptions.
  // `timeout` is the blocking call's own timeout (0 for the others).
  wire::Response call(wire::Request& q, milliseconds timeout) {
    std::lock_guard callLock(callMutex_);
    if (broken_) throw NetworkError(brokenText());
    q.id = ++lastId_;
    bool blocking = wire::isBlocking(q.op);
    timeout = clampTimeout(timeout);
    if (blocking) q.timeoutMs = static_cast<uint32_t>(timeout.count());
    std::string frame;
    wire::encodeRequest(q, frame);  // InvalidArgument before anything is sent
    const milliseconds grace = options_.replyGrace > 0ms ? options_.replyGrace : replyGrace(timeout);
    milliseconds budget = blocking ? timeout + grace : clampTimeout(options_.timeout);
    Deadline deadline(budget);
    auto started = Clock::now();
    {
      std::lock_guard writeLock(writeMutex_);
      writeAll(frame, deadline, q);
    }
    wire::Response p = readResponse(q, deadline, budget);
    if (std::exception_ptr failure = failureOf(p, q, timeout, started))
      std::rethrow_exception(failure);
    return p;
  }

  // Pipelines the requests (none blocking): every frame in one write, then the answers in
  // order, each Ok or its error in `answers[i].second`. A request that does not encode is not
  // sent (its error is its answer). NetworkError / ProtocolError: the connection is lost.
  // `onAnswer(i, response, failure)` is called for each request as its answer comes (in order;
  // for one not sent, with its encoding error), so that what came before a lost connection is
  // known.
  using OnAnswer = std::function<void(size_t, wire::Response&, std::exception_ptr)>;
  void callPipelined(std::vector<wire::Request>& requests, const OnAnswer& onAnswer) {
    std::lock_guard callLock(callMutex_);
    if (broken_) throw NetworkError(brokenText());
    std::vector<std::exception_ptr> unsent(requests.size());
    std::vector<bool> sent(requests.size(), false);
    std::string frames;
    for (size_t i = 0; i < requests.size(); ++i) {
      wire::Request& q = requests[i];
      if (wire::isBlocking(q.op) || !wire::expectsResponse(q.op))
        throw InvalidArgument(std::string("a pipelined batch cannot carry ") +
                              std::string(wire::toString(q.op)));
      const size_t before = frames.size();
      try {
        q.id = lastId_ + 1;
        wire::encodeRequest(q, frames);
        ++lastId_;
        sent[i] = true;
      } catch (const InvalidArgument&) {
        frames.resize(before);
        unsent[i] = std::current_exception();
      }
    }
    const milliseconds budget = clampTimeout(options_.timeout);
    Deadline deadline(budget);
    const auto started = Clock::now();
    if (!frames.empty()) {
      std::lock_guard writeLock(writeMutex_);
      writeAll(frames, deadline, requests.front());
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      wire::Response p;
      if (!sent[i]) {
        onAnswer(i, p, unsent[i]);
        continue;
      }
      p = readResponse(requests[i], deadline, budget);
      onAnswer(i, p, failureOf(p, requests[i], 0ms, started));
    }
  }

  // The answer to a request whose shape is not that of its op: the peer is not a sound store.
  [[noreturn]] void malformed(const wire::Request& q, const std::string& why) {
    markBroken("store at " + endpoint_ + " answered " + std::string(wire::toString(q.op)) + " " +
               keyList(q.keys) + " with " + why);
    throw ProtocolError(brokenText());
  }

 private:
  // An error status as the exception the call throws (null for Ok).
  std::exception_ptr failureOf(const wire::Response& p, const wire::Request& q,
                               milliseconds timeout, Clock::time_point started) {
    switch (p.status) {
      case wire::Status::Ok:
        return nullptr;
      case wire::Status::Timeout:
        return std::make_exception_ptr(
            TimeoutError(std::string(wire::toString(q.op)) + " timed out after " +
                         std::to_string(timeout.count()) + "ms on " +
                         keyList(p.keys.empty() ? q.keys : p.keys) + " at " + endpoint_));
      case wire::Status::InvalidArgument:
        return std::make_exception_ptr(
            InvalidArgument(std::string(wire::toString(q.op)) + " " + keyList(q.keys) + " at " +
                            endpoint_ + ": " + serverText(p.message)));
      default: {
        auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - started);
        return std::make_exception_ptr(
            Error(std::string(wire::toString(q.op)) + " " + keyList(q.keys) + " at " + endpoint_ +
                  " failed after " + std::to_string(waited.count()) +
                  "ms: " + serverText(p.message)));
      }
    }
  }

  // ---- connecting

  void connectWithRetries(const Deadline& deadline) {
    std::mt19937_64 rng(std::random_device{}());
    milliseconds backoff(10);
    std::string lastError = "no attempt";
    int attempts = 0;
    auto started = Clock::now();
    ProgressPacer progress(options_.progressInterval);
    for (;;) {
      ++attempts;
      if (options_.onConnectWait && progress.due())
        options_.onConnectWait("cannot reach the rendezvous store at " + endpoint_ + " yet (" +
                               lastError + "); retrying for " +
                               humanDuration(deadline.remaining()) + " more");
      if (tryConnect(deadline, lastError)) {
        spdlog::debug("store client: connected to {} after {} attempt(s), {}ms", endpoint_,
                      attempts,
                      std::chrono::duration_cast<milliseconds>(Clock::now() - started).count());
        return;
      }
      // Refused to the end: the host answers but nothing serves the port (a dead store host).
      if (deadline.expired() && lastErrno_ == ECONNREFUSED)
        throw NetworkError("connect to store at " + endpoint_ + ": connection refused (" +
                           std::to_string(attempts) + " attempts in " +
                           std::to_string(options_.connectTimeout.count()) + "ms)");
      if (deadline.expired())
        throw TimeoutError("connect to store at " + endpoint_ + " timed out after " +
                           std::to_string(options_.connectTimeout.count()) + "ms (" +
                           std::to_string(attempts) + " attempts, last error: " + lastError + ")");
      // Exponential backoff with jitter, so many agents starting together do not knock in step.
      std::uniform_real_distribution<double> jitter(0.5, 1.5);
      milliseconds sleep(static_cast<long long>(backoff.count() * jitter(rng)));
      sleep = std::max(milliseconds(1), std::min(sleep, deadline.remaining()));
      spdlog::debug("store client: connect to {} failed ({}); retry in {}ms", endpoint_,
                    lastError, sleep.count());
      std::this_thread::sleep_for(sleep);
      backoff = std::min(backoff * 2, milliseconds(1000));
    }
  }

  bool tryConnect(const Deadline& deadline, std::string& error) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    // The resolver gets what is left of the connect deadline, at most net::kResolveTimeout.
    net::Resolved resolved = net::resolve(options_.host, std::to_string(options_.port), hints,
                                          std::min(deadline.remaining(), net::kResolveTimeout));
    if (!resolved.addresses) {
      error = resolved.error;
      return false;
    }
    for (addrinfo* a = resolved.addresses.get(); a; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        error = "socket: " + errnoText(errno);
        continue;
      }
      int r = ::connect(fd, a->ai_addr, a->ai_addrlen);
      if (r != 0 && errno == EINPROGRESS) {
        if (!pollUntil(fd, POLLOUT, deadline)) {
          ::close(fd);
          error = "connect timed out";
          return false;
        }
        int soError = 0;
        socklen_t len = sizeof soError;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soError, &len);
        r = soError == 0 ? 0 : -1;
        errno = soError;
      }
      if (r != 0) {
        lastErrno_ = errno;
        error = errnoText(errno);
        ::close(fd);
        continue;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      fd_ = fd;
      return true;
    }
    return false;
  }

  void handshake(const Deadline& deadline) {
    wire::Hello hello;
    hello.leaseMs = static_cast<uint32_t>(clampTimeout(options_.leaseTimeout).count());
    hello.nonce = wire::randomNonce();
    hello.scope = options_.scope;
    std::string out;
    wire::encodeHello(hello, out);
    wire::Request none;
    writeAll(out, deadline, none);
    wire::HelloReply reply;
    readHandshake([&](std::string_view in) { return wire::decodeHelloReply(in, reply); },
                  deadline, "the hello");
    if (reply.status == wire::HelloStatus::Busy)
      throw NetworkError("store at " + endpoint_ +
                         " refused the connection: it is at its connection limit (in all or for "
                         "this address)");
    if (reply.status == wire::HelloStatus::VersionMismatch)
      throw ProtocolError("store at " + endpoint_ + " speaks protocol version " +
                          std::to_string(reply.version) + ", this client version " +
                          std::to_string(wire::kVersion));
    lease_ = milliseconds(reply.leaseMs);
    const std::string job = options_.scope.empty() ? "" : " (job '" + options_.scope + "')";
    if (reply.tokenRequired && options_.token.empty())
      throw AuthError("store at " + endpoint_ + " requires a token" + job +
                      ": give the job's token file (--rdzv-conf token_file=PATH or "
                      "DRUN_RDZV_TOKEN_FILE)");
    if (!reply.tokenRequired && !options_.token.empty())
      throw AuthError("store at " + endpoint_ + " does not ask for a token, but this client has "
                      "one: it is not the job's store, or it was started without the token");
    if (!reply.tokenRequired) return;
    std::string auth;
    wire::encodeAuth(wire::clientProof(options_.token, hello.nonce, reply.nonce, options_.scope),
                     auth);
    writeAll(auth, deadline, none);
    wire::AuthReply verdict;
    readHandshake([&](std::string_view in) { return wire::decodeAuthReply(in, verdict); },
                  deadline, "the token check");
    if (verdict.status != wire::AuthStatus::Ok)
      throw AuthError("store at " + endpoint_ + " refused this client's token" + job +
                      ": the token files differ");
    if (!wire::equalMacs(verdict.mac, wire::serverProof(options_.token, hello.nonce, reply.nonce,
                                                        options_.scope)))
      throw AuthError("store at " + endpoint_ + " did not prove it knows the token" + job +
                      ": it is not the job's store");
  }

  // Reads one handshake message: `decode` answers NeedMore until it is whole.
  template <class Decode>
  void readHandshake(Decode decode, const Deadline& deadline, const char* what) {
    for (;;) {
      auto r = decode(in_.data());
      if (r.status == wire::DecodeStatus::Ok) {
        in_.consume(r.consumed);
        return;
      }
      if (r.status == wire::DecodeStatus::Bad)
        throw ProtocolError("peer at " + endpoint_ + " is " + r.error);
      if (!pollUntil(fd_, POLLIN, deadline))
        throw TimeoutError("store at " + endpoint_ + " did not answer " + what + " within " +
                           std::to_string(options_.connectTimeout.count()) + "ms");
      receive();
    }
  }

  // ---- bytes

  // Reads what is available into in_; throws NetworkError on EOF/error.
  void receive() {
    char* at = in_.prepare(16 * 1024);
    ssize_t n = ::recv(fd_, at, 16 * 1024, 0);
    if (n > 0) {
      in_.commit(static_cast<size_t>(n));
      return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    std::string why = n == 0 ? "closed by the server" : errnoText(errno);
    markBroken("connection to store at " + endpoint_ + " lost: " + why);
    throw NetworkError(brokenText());
  }

  void writeAll(std::string_view data, const Deadline& deadline, const wire::Request& q) {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (pollUntil(fd_, POLLOUT, deadline)) continue;
        // Part of a frame is out: the stream can no longer be framed.
        if (done > 0) markBroken("write to store at " + endpoint_ + " stalled mid-frame");
        throw TimeoutError(std::string(wire::toString(q.op)) + " " + keyList(q.keys) +
                           ": could not send to store at " + endpoint_ + " in time");
      }
      markBroken("connection to store at " + endpoint_ + " lost: " + errnoText(errno));
      throw NetworkError(brokenText());
    }
  }

  wire::Response readResponse(const wire::Request& q, const Deadline& deadline,
                              milliseconds budget) {
    for (;;) {
      wire::Response p;
      auto r = wire::decodeResponse(in_.data(), p);
      if (r.status == wire::DecodeStatus::Bad) {
        markBroken("store at " + endpoint_ + " sent a malformed reply: " + r.error);
        throw ProtocolError(brokenText());
      }
      if (r.status == wire::DecodeStatus::Ok) {
        in_.consume(r.consumed);
        if (p.status == wire::Status::ProtocolError) {
          markBroken("store at " + endpoint_ + " rejected our request: " + serverText(p.message));
          throw ProtocolError(brokenText());
        }
        if (p.id > q.id) {
          // Requests are answered in order: an answer ahead of this one is to a request this
          // client has not sent (yet): the stream is out of step.
          markBroken("store at " + endpoint_ + " answered request " + std::to_string(p.id) +
                     " while request " + std::to_string(q.id) + " was the next one due");
          throw ProtocolError(brokenText());
        }
        if (p.id == q.id) {
          if (p.op != q.op) {
            markBroken("store at " + endpoint_ + " answered request " + std::to_string(q.id) +
                       " with the wrong op");
            throw ProtocolError(brokenText());
          }
          return p;
        }
        continue;  // the late answer to a call that gave up waiting earlier
      }
      if (broken_) throw NetworkError(brokenText());
      if (!pollUntil(fd_, POLLIN, deadline)) {
        // The server answers every call by its deadline (a blocking one with Timeout), so no
        // reply within the budget means the link or the server is gone (a cut cable sends no
        // reset): the connection is lost, not merely slow.
        markBroken(std::string(wire::toString(q.op)) + " on " + keyList(q.keys) +
                   ": no reply from store at " + endpoint_ + " after " +
                   std::to_string(budget.count()) + "ms: connection presumed lost");
        throw NetworkError(brokenText());
      }
      receive();
    }
  }

  void markBroken(const std::string& why) {
    std::lock_guard lock(brokenMutex_);
    if (broken_) return;
    brokenReason_ = why;
    broken_ = true;
    ::shutdown(fd_, SHUT_RDWR);  // wakes a call blocked in poll(); the fd is closed later
    spdlog::debug("store client: {}", why);
  }

  std::string brokenText() {
    std::lock_guard lock(brokenMutex_);
    return brokenReason_;
  }

  // ---- heartbeats

  void heartbeatLoop() {
    std::string frame;
    wire::Request beat;
    beat.op = Op::Heartbeat;
    wire::encodeRequest(beat, frame);  // id 0: heartbeats are never answered
    std::unique_lock lock(heartbeatMutex_);
    while (!heartbeatCv_.wait_for(lock, options_.heartbeatInterval, [&] { return stopHeartbeat_; })) {
      if (broken_) continue;
      lock.unlock();
      try {
        std::lock_guard writeLock(writeMutex_);
        writeAll(frame, Deadline(options_.heartbeatInterval), beat);
      } catch (const Error& e) {
        spdlog::debug("store client: heartbeat to {} failed: {}", endpoint_, e.what());
      }
      lock.lock();
    }
  }

  TcpStoreOptions options_;
  std::string endpoint_;
  int fd_ = -1;
  int lastErrno_ = 0;  // errno of the latest failed connect attempt
  milliseconds lease_{0};
  wire::ReceiveBuffer in_;  // under callMutex_ (or the constructor)
  uint64_t lastId_ = 0;     // under callMutex_
  std::mutex callMutex_;    // one request in flight per connection
  std::mutex writeMutex_;   // frames go out whole: calls and heartbeats
  std::atomic<bool> broken_{false};
  std::mutex brokenMutex_;
  std::string brokenReason_;
  std::thread heartbeat_;
  std::mutex heartbeatMutex_;
  std::condition_variable heartbeatCv_;
  bool stopHeartbeat_ = false;
};

// -------------------------------------------------------------------------------------- TcpStore

namespace {

wire::Request request(Op op, std::vector<std::string> keys = {}, std::vector<Bytes> values = {}) {
  wire::Request q;
  q.op = op;
  q.keys = std::move(keys);
  q.values = std::move(values);
  return q;
}

}  // namespace

TcpStore::TcpStore(const TcpStoreOptions& options) : conn_(std::make_unique<Connection>(options)) {}
TcpStore::~TcpStore() = default;

const std::string& TcpStore::endpoint() const { return conn_->endpoint(); }
milliseconds TcpStore::leaseTimeout() const { return conn_->lease(); }
void TcpStore::stopHeartbeatsForTest() { conn_->stopHeartbeats(); }
void TcpStore::interrupt() { conn_->interrupt(); }

void TcpStore::set(const std::string& key, const Bytes& value) {
  auto q = request(Op::Set, {key}, {value});
  conn_->call(q, {});
}

Bytes TcpStore::get(const std::string& key, milliseconds timeout) {
  auto q = request(Op::Get, {key});
  auto p = conn_->call(q, timeout);
  if (p.values.size() != 1) conn_->malformed(q, std::to_string(p.values.size()) + " values, not 1");
  return std::move(p.values[0]);
}

std::optional<Bytes> TcpStore::tryGet(const std::string& key) {
  auto q = request(Op::TryGet, {key});
  auto p = conn_->call(q, {});
  if (p.values.empty()) return std::nullopt;
  return std::move(p.values[0]);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  auto q = request(Op::Add, {key});
  q.delta = delta;
  return conn_->call(q, {}).number;
}

Bytes TcpStore::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  auto q = request(Op::CompareSet, {key}, {expected, desired});
  auto p = conn_->call(q, {});
  if (p.values.size() != 1) conn_->malformed(q, std::to_string(p.values.size()) + " values, not 1");
  return std::move(p.values[0]);
}

void TcpStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  auto q = request(Op::Wait, keys);
  conn_->call(q, timeout);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  auto q = request(Op::Check, keys);
  return conn_->call(q, {}).number != 0;
}

bool TcpStore::deleteKey(const std::string& key) {
  auto q = request(Op::Delete, {key});
  return conn_->call(q, {}).number != 0;
}

int64_t TcpStore::numKeys() {
  auto q = request(Op::NumKeys);
  return conn_->call(q, {}).number;
}

std::vector<Bytes> TcpStore::multiGet(const std::vector<std::string>& keys, milliseconds timeout) {
  auto q = request(Op::MultiGet, keys);
  auto p = conn_->call(q, timeout);
  if (p.values.size() != keys.size())
    throw ProtocolError("multiGet at " + endpoint() + ": asked " + std::to_string(keys.size()) +
                        " keys, got " + std::to_string(p.values.size()) + " values");
  return std::move(p.values);
}

void TcpStore::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size())
    throw InvalidArgument("multiSet: " + std::to_string(keys.size()) + " keys but " +
                          std::to_string(values.size()) + " values");
  auto q = request(Op::MultiSet, keys, values);
  conn_->call(q, {});
}

void TcpStore::append(const std::string& key, const Bytes& value) {
  auto q = request(Op::Append, {key}, {value});
  conn_->call(q, {});
}

std::optional<Bytes> TcpStore::watch(const std::string& key, const std::optional<Bytes>& known,
                                     milliseconds timeout) {
  auto q = request(Op::Watch, {key});
  q.known = known;
  auto p = conn_->call(q, timeout);
  if (p.values.empty()) return std::nullopt;
  return std::move(p.values[0]);
}

void TcpStore::setWill(const Will& will) {
  auto q = request(Op::SetWill);
  q.will = will;
  conn_->call(q, {});
}

int64_t TcpStore::deletePrefix(const std::string& prefix) {
  if (prefix.empty()) throw InvalidArgument("deletePrefix: the prefix must not be empty");
  auto q = request(Op::DeletePrefix, {prefix});
  return conn_->call(q, {}).number;
}

// One round trip for the whole batch (store_batch.hpp). An answer whose shape is not its op's
// (a compareSet without the value now stored, a tryGet with two) means the peer is not a sound
// store: ProtocolError, the connection is dropped.
void TcpStore::runBatch(StoreBatch& batch) {
  using Kind = StoreBatch::Kind;
  batch.clearOutcomes();
  std::vector<wire::Request> requests;
  requests.reserve(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const StoreBatch::Op& op = batch.op(i);
    switch (op.kind) {
      case Kind::Set: requests.push_back(request(Op::Set, {op.key}, {op.value})); break;
      case Kind::TryGet: requests.push_back(request(Op::TryGet, {op.key})); break;
      case Kind::Add:
        requests.push_back(request(Op::Add, {op.key}));
        requests.back().delta = op.delta;
        break;
      case Kind::CompareSet:
        requests.push_back(request(Op::CompareSet, {op.key}, {op.value, op.desired}));
        break;
      case Kind::Append: requests.push_back(request(Op::Append, {op.key}, {op.value})); break;
      case Kind::SetWill:
        requests.push_back(request(Op::SetWill));
        requests.back().will = op.will;
        break;
      case Kind::DeleteKey: requests.push_back(request(Op::Delete, {op.key})); break;
      case Kind::DeletePrefix: requests.push_back(request(Op::DeletePrefix, {op.key})); break;
    }
  }
  if (requests.empty()) return;
  conn_->callPipelined(requests, [&](size_t i, wire::Response& p, std::exception_ptr failure) {
    StoreBatch::Outcome& out = batch.outcome(i);
    out.ran = true;
    out.error = failure;
    if (failure) return;
    const Kind kind = batch.op(i).kind;
    if (kind == Kind::TryGet && p.values.size() > 1)
      conn_->malformed(requests[i], std::to_string(p.values.size()) + " values");
    if (kind == Kind::CompareSet && p.values.size() != 1)
      conn_->malformed(requests[i], std::to_string(p.values.size()) + " values, not 1");
    if (!p.values.empty()) out.value = std::move(p.values[0]);
    out.number = kind == Kind::DeleteKey ? (p.number != 0 ? 1 : 0) : p.number;
  });
  batch.rethrowFirstFailure();
}

std::vector<std::string> TcpStore::listJobs() {
  auto q = request(Op::ListJobs);
  return std::move(conn_->call(q, {}).values);
}

}  // namespace drun::rdzv

// TcpStore::Connection: connecting to the server (retries with backoff) and the handshake.
#include "tcp_store_connection.hpp"

namespace drun::rdzv {

void TcpStore::Connection::connectWithRetries(const Deadline& deadline) {
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

bool TcpStore::Connection::tryConnect(const Deadline& deadline, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  // The resolver gets what is left of the connect deadline, at most net::kResolveTimeout.
  net::Resolved resolved = net::resolve(options_.endpoint.host, std::to_string(options_.endpoint.port), hints,
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

void TcpStore::Connection::handshake(const Deadline& deadline) {
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
                    ": give the job's token file (" + options_.tokenHint + ")");
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

template <class Decode>
void TcpStore::Connection::readHandshake(Decode decode, const Deadline& deadline, const char* what) {
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

}  // namespace drun::rdzv

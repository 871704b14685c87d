#include "etcd_http.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <limits>
#include <utility>  // before Asio 1.74's awaitable.hpp, which uses std::exchange
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "drun/common/error.hpp"
#include "drun/common/resolve.hpp"

namespace drun::rdzv::etcd {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using asio::awaitable;
using asio::use_awaitable;

// Steady-clock time points far in the future overflow inside Asio's timers.
Clock::time_point clampDeadline(const Deadline& deadline) {
  const auto limit = Clock::now() + std::chrono::hours(24 * 365);
  return std::min(deadline.when(), limit);
}

bool isHttpError(const boost::system::error_code& ec) {
  return ec.category() == http::make_error_code(http::error::end_of_stream).category();
}

}  // namespace

struct EtcdConnection::Impl {
  asio::io_context ioc;
  std::unique_ptr<asio::ssl::context> tls;
  std::unique_ptr<beast::tcp_stream> plain;
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> secure;
  beast::flat_buffer buffer;
  std::atomic<bool> interrupted{false};
  bool connected = false;
  KeepAliveProbes probes;

  tcp::socket& socket() { return secure ? secure->next_layer().socket() : plain->socket(); }

  void reset() {
    if (plain || secure) {
      boost::system::error_code ignored;
      socket().close(ignored);
    }
    plain.reset();
    secure.reset();
    buffer.clear();
    connected = false;
  }

  // An idle connection the peer shut down (FIN: POLLRDHUP) or reset (POLLHUP, POLLERR): closed.
  // Readable data alone is no sign (a TLS session ticket may arrive after the handshake).
  bool closeIfPeerClosed() {
    if (!connected) return false;
    pollfd p{socket().native_handle(), POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0 || !(p.revents & (POLLRDHUP | POLLHUP | POLLERR))) return false;
    reset();
    return true;
  }

  // Runs `task` on the private io_context until it completes or the deadline passes.
  void run(const Endpoint& endpoint, const Deadline& deadline, const std::string& what,
           std::function<awaitable<void>()> task) {
    if (interrupted) throw NetworkError("etcd " + endpoint.toString() + ": " + what + ": interrupted");
    bool done = false;
    bool timedOut = false;
    std::exception_ptr failure;
    asio::steady_timer timer(ioc);
    timer.expires_at(clampDeadline(deadline));
    timer.async_wait([&](const boost::system::error_code& ec) {
      if (ec || done) return;
      timedOut = true;
      if (plain || secure) {
        boost::system::error_code ignored;
        socket().close(ignored);  // every pending operation ends with operation_aborted
      }
    });
    asio::co_spawn(ioc, std::move(task), [&](std::exception_ptr e) {
      done = true;
      failure = e;
      timer.cancel();
    });
    ioc.restart();
    if (!interrupted) ioc.run();
    // Interrupted (stop() or before the start): end the operations, then let them complete, since
    // their handlers refer to this frame.
    if (!done) {
      if (plain || secure) {
        boost::system::error_code ignored;
        socket().close(ignored);
      }
      timer.cancel();
      while (!done) {
        ioc.restart();
        ioc.run_for(std::chrono::milliseconds(20));
      }
    }
    if (interrupted) {
      reset();
      throw NetworkError("etcd " + endpoint.toString() + ": " + what + ": interrupted");
    }
    if (timedOut) {
      reset();
      throw TimeoutError("etcd " + endpoint.toString() + ": " + what + " timed out");
    }
    if (!failure) return;
    reset();
    try {
      std::rethrow_exception(failure);
    } catch (const boost::system::system_error& e) {
      // OpenSSL refused the handshake (a certificate that does not verify): retrying elsewhere
      // would fail the same way.
      if (e.code().category() == asio::error::get_ssl_category())
        throw AuthError("etcd " + endpoint.toString() + ": " + what + ": TLS: " + e.code().message() +
                        " (is etcd_cacert the CA of the members' certificates?)");
      if (isHttpError(e.code()) && e.code() != http::error::end_of_stream &&
          e.code() != http::error::partial_message)
        throw ProtocolError("etcd " + endpoint.toString() + ": " + what + ": not a valid HTTP reply (" +
                            e.code().message() + ")");
      throw NetworkError("etcd " + endpoint.toString() + ": " + what + ": " + e.code().message());
    }
  }

  awaitable<void> connect(const Endpoint& endpoint, const Deadline& deadline) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    const auto remaining = std::min<milliseconds>(deadline.remaining(), net::kResolveTimeout);
    net::Resolved resolved = net::resolve(endpoint.host, std::to_string(endpoint.port), hints,
                                          std::max<milliseconds>(remaining, milliseconds(1)));
    if (!resolved.addresses)
      throw NetworkError("etcd " + endpoint.toString() + ": " + resolved.error);
    std::vector<tcp::endpoint> targets;
    for (addrinfo* a = resolved.addresses.get(); a; a = a->ai_next) {
      tcp::endpoint target;
      if (a->ai_addrlen > target.capacity()) continue;
      std::memcpy(target.data(), a->ai_addr, a->ai_addrlen);
      target.resize(a->ai_addrlen);
      targets.push_back(target);
    }
    if (tls) {
      secure = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(ioc, *tls);
      if (!SSL_set_tlsext_host_name(secure->native_handle(), endpoint.host.c_str()))
        throw NetworkError("etcd " + endpoint.toString() + ": cannot set the TLS server name");
      secure->set_verify_callback(asio::ssl::host_name_verification(endpoint.host));
      co_await asio::async_connect(secure->next_layer().socket(), targets, use_awaitable);
      co_await secure->async_handshake(asio::ssl::stream_base::client, use_awaitable);
    } else {
      plain = std::make_unique<beast::tcp_stream>(ioc);
      co_await asio::async_connect(plain->socket(), targets, use_awaitable);
    }
    applyKeepAliveProbes((tls ? secure->next_layer().socket() : plain->socket()).native_handle(), probes);
    connected = true;
  }

  template <class Message>
  awaitable<void> write(Message& request) {
    if (secure) co_await http::async_write(*secure, request, use_awaitable);
    else co_await http::async_write(*plain, request, use_awaitable);
  }
  template <class Parser>
  awaitable<void> read(Parser& parser) {
    if (secure) co_await http::async_read(*secure, buffer, parser, use_awaitable);
    else co_await http::async_read(*plain, buffer, parser, use_awaitable);
  }
  template <class Parser>
  awaitable<void> readHeader(Parser& parser) {
    if (secure) co_await http::async_read_header(*secure, buffer, parser, use_awaitable);
    else co_await http::async_read_header(*plain, buffer, parser, use_awaitable);
  }
  template <class Parser>
  awaitable<void> readSome(Parser& parser) {
    if (secure) co_await http::async_read_some(*secure, buffer, parser, use_awaitable);
    else co_await http::async_read_some(*plain, buffer, parser, use_awaitable);
  }
};

namespace {

http::request<http::string_body> makeRequest(const Endpoint& endpoint, const std::string& target,
                                             const std::string& body, const std::string& token,
                                             bool requireLeader) {
  http::request<http::string_body> request{http::verb::post, target, 11};
  request.set(http::field::host, endpoint.host);
  request.set(http::field::content_type, "application/json");
  if (!token.empty()) request.set(http::field::authorization, token);
  // gRPC metadata through the gateway: "require a leader" (clientv3's WithRequireLeader). A member
  // cut off from the quorum then refuses a call at once ("etcdserver: no leader": the client
  // fails over) and closes its watch streams within about three election timeouts, where it would
  // otherwise keep a watch open that no event can reach (an agent on the majority side would
  // learn that a cut-off node was lost tens of seconds late).
  if (requireLeader) request.set("Grpc-Metadata-Hasleader", "true");
  request.keep_alive(true);
  request.body() = body;
  request.prepare_payload();
  return request;
}

}  // namespace

KeepAliveProbes keepAliveProbesFor(std::chrono::milliseconds silence) {
  KeepAliveProbes probes;
  const int64_t third = std::chrono::duration_cast<std::chrono::seconds>(silence / 3).count();
  probes.idleSeconds = static_cast<int>(std::clamp<int64_t>(third, 1, 3600));
  probes.intervalSeconds = probes.idleSeconds;
  probes.count = 2;
  probes.userTimeoutMs = static_cast<unsigned>(std::clamp<int64_t>(silence.count(), 1000, 3600 * 1000));
  return probes;
}

bool applyKeepAliveProbes(int fd, const KeepAliveProbes& probes) {
  const int on = 1;
  bool ok = ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) == 0;
  ok = ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &probes.idleSeconds, sizeof probes.idleSeconds) == 0 && ok;
  ok = ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &probes.intervalSeconds, sizeof probes.intervalSeconds) == 0 && ok;
  ok = ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes.count, sizeof probes.count) == 0 && ok;
  return ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &probes.userTimeoutMs, sizeof probes.userTimeoutMs) == 0 && ok;
}

EtcdConnection::EtcdConnection(Endpoint endpoint, std::string caFile, KeepAliveProbes probes, bool requireLeader)
    : endpoint_(std::move(endpoint)), requireLeader_(requireLeader), impl_(std::make_unique<Impl>()) {
  impl_->probes = probes;
  if (caFile.empty()) return;
  impl_->tls = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_client);
  boost::system::error_code ec;
  impl_->tls->load_verify_file(caFile, ec);
  if (ec)
    throw InvalidArgument("etcd_cacert: cannot load the CA file '" + caFile + "': " + ec.message());
  impl_->tls->set_verify_mode(asio::ssl::verify_peer);
}

EtcdConnection::~EtcdConnection() { impl_->reset(); }

bool EtcdConnection::closeIfPeerClosed() { return impl_->closeIfPeerClosed(); }

void EtcdConnection::interrupt() {
  impl_->interrupted = true;
  impl_->ioc.stop();
}

HttpReply EtcdConnection::post(const std::string& target, const std::string& body,
                               const std::string& token, const Deadline& deadline, bool* sent) {
  auto request = makeRequest(endpoint_, target, body, token, requireLeader_);
  HttpReply reply;
  bool mayHaveSent = false;
  impl_->closeIfPeerClosed();  // not worth a request that cannot get an answer
  for (int attempt = 0;; ++attempt) {
    const bool reused = impl_->connected;
    bool gotSome = false;
    try {
      impl_->run(endpoint_, deadline, "POST " + target, [&]() -> awaitable<void> {
        if (!impl_->connected) co_await impl_->connect(endpoint_, deadline);
        mayHaveSent = true;
        co_await impl_->write(request);
        http::response_parser<http::string_body> parser;
        parser.body_limit(kMaxReplyBytes);
        parser.header_limit(64 * 1024);
        try {
          // The length a reply claims is checked before anything is allocated for it.
          co_await impl_->readHeader(parser);
          if (parser.content_length() && *parser.content_length() > kMaxReplyBytes)
            throw ProtocolError("etcd " + endpoint_.toString() + ": a reply of " +
                                std::to_string(*parser.content_length()) + " bytes (limit " +
                                std::to_string(kMaxReplyBytes) + ")");
          co_await impl_->read(parser);
        } catch (...) {
          gotSome = parser.got_some();
          throw;
        }
        reply.status = parser.get().result_int();
        reply.body = std::move(parser.get().body());
        if (!parser.get().keep_alive()) impl_->reset();
      });
      if (sent) *sent = mayHaveSent;
      return reply;
    } catch (const NetworkError&) {
      // A kept-alive connection the member closed meanwhile: the request never got an answer
      // byte; once more on a fresh connection.
      if (reused && !gotSome && attempt == 0 && !impl_->interrupted) continue;
      if (sent) *sent = mayHaveSent;
      throw;
    } catch (...) {
      if (sent) *sent = mayHaveSent;
      throw;
    }
  }
}

void EtcdConnection::stream(const std::string& target, const std::string& body,
                            const std::string& token, const Deadline& deadline,
                            const std::function<bool(unsigned, std::string_view)>& onLine) {
  auto request = makeRequest(endpoint_, target, body, token, requireLeader_);
  std::exception_ptr callbackFailure;
  impl_->run(endpoint_, deadline, "POST " + target + " (stream)", [&]() -> awaitable<void> {
    if (!impl_->connected) co_await impl_->connect(endpoint_, deadline);
    co_await impl_->write(request);
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    parser.header_limit(64 * 1024);
    co_await impl_->readHeader(parser);
    const unsigned status = parser.get().result_int();
    if (status != 200) {
      parser.body_limit(kMaxReplyBytes);
      co_await impl_->read(parser);
      onLine(status, parser.get().body());
      co_return;
    }
    std::string pending;
    while (!parser.is_done()) {
      co_await impl_->readSome(parser);
      std::string& got = parser.get().body();
      pending += got;
      got.clear();
      size_t start = 0;
      for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
        std::string_view line(pending.data() + start, nl - start);
        if (line.find_first_not_of(" \r\t") == std::string_view::npos) continue;
        bool more = false;
        try {
          more = onLine(status, line);
        } catch (...) {
          callbackFailure = std::current_exception();
          more = false;
        }
        if (!more) co_return;
      }
      pending.erase(0, start);
      if (pending.size() > kMaxReplyBytes)
        throw ProtocolError("etcd " + endpoint_.toString() + ": a stream message over " +
                            std::to_string(kMaxReplyBytes) + " bytes");
    }
    throw NetworkError("etcd " + endpoint_.toString() + ": the stream " + target + " ended");
  });
  impl_->reset();  // a stream's connection is not reused
  if (callbackFailure) std::rethrow_exception(callbackFailure);
}

}  // namespace drun::rdzv::etcd

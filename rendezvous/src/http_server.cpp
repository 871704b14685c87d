#include "drun/rendezvous/http_server.hpp"

#include <utility>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <set>
#include <spdlog/spdlog.h>

#include "drun/common/crypto.hpp"
#include "drun/common/error.hpp"

namespace drun::rdzv::monitor {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr size_t kMaxHeaderBytes = 8192;
constexpr size_t kMaxBodyBytes = 1024;
constexpr int kMaxRequestsPerConnection = 100;

bool sameSecret(std::string_view given, const std::string& token) {
  return crypto::equalDigests(crypto::sha256(given), crypto::sha256(token));
}

// "?a=b&token=T" -> T ("" when absent).
std::string queryToken(std::string_view target) {
  const size_t q = target.find('?');
  if (q == std::string_view::npos) return "";
  std::string_view query = target.substr(q + 1);
  while (!query.empty()) {
    const size_t amp = query.find('&');
    std::string_view item = query.substr(0, amp);
    if (item.starts_with("token=")) return std::string(item.substr(6));
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return "";
}

}  // namespace

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  Impl(asio::io_context& io, HttpOptions o, Handler h)
      : acceptor(io), options(std::move(o)), handler(std::move(h)) {}

  tcp::acceptor acceptor;
  HttpOptions options;
  Handler handler;
  HttpCounters counters;
  bool stopped = false;
  std::set<beast::tcp_stream*> streams;  // open connections, closed by stop()

  void stop() {
    stopped = true;
    boost::system::error_code ec;
    acceptor.close(ec);
    for (beast::tcp_stream* s : streams) s->socket().close(ec);
  }

  http::response<http::string_body> respond(const http::request<http::string_body>& request) {
    http::response<http::string_body> response;
    response.version(request.version());
    response.keep_alive(request.keep_alive());
    response.set(http::field::server, options.serverName);
    response.set(http::field::cache_control, "no-store");
    auto fail = [&](http::status status, const std::string& text) {
      response.result(status);
      response.set(http::field::content_type, "text/plain; charset=utf-8");
      response.body() = text + "\n";
    };
    const std::string_view target(request.target().data(), request.target().size());
    std::string path(target.substr(0, target.find('?')));
    if (!options.token.empty()) {
      std::string given = queryToken(target);
      auto auth = request.find(http::field::authorization);
      if (auth != request.end() && auth->value().starts_with("Bearer "))
        given = std::string(auth->value().substr(7));
      if (given.empty() || !sameSecret(given, options.token)) {
        ++counters.unauthorized;
        fail(http::status::unauthorized, "this drun-rendezvous needs its token: "
                                         "Authorization: Bearer <token> or ?token=<token>");
        response.set(http::field::www_authenticate, "Bearer");
        response.prepare_payload();
        return response;
      }
    }
    if (request.method() != http::verb::get && request.method() != http::verb::head) {
      fail(http::status::method_not_allowed, "only GET");
    } else {
      Reply reply;
      try {
        reply = handler(path);
      } catch (const std::exception& e) {
        reply = {"", ""};
        spdlog::warn("http: {} failed: {}", path, e.what());
        fail(http::status::internal_server_error, "internal error");
        response.prepare_payload();
        return response;
      }
      if (reply.contentType.empty()) {
        fail(http::status::not_found, "no such page: try /, /api/jobs, /metrics or /healthz");
      } else {
        response.result(http::int_to_status(reply.status));
        response.set(http::field::content_type, reply.contentType);
        response.body() = std::move(reply.body);
      }
    }
    response.prepare_payload();
    return response;
  }

  asio::awaitable<void> serve(tcp::socket socket) {
    auto self = shared_from_this();
    ++counters.open;
    beast::tcp_stream stream(std::move(socket));
    streams.insert(&stream);
    beast::flat_buffer buffer(kMaxHeaderBytes + kMaxBodyBytes);
    boost::system::error_code ec;
    for (int served = 0; served < kMaxRequestsPerConnection && !stopped; ++served) {
      http::request_parser<http::string_body> parser;
      parser.header_limit(kMaxHeaderBytes);
      parser.body_limit(kMaxBodyBytes);
      stream.expires_after(options.requestTimeout);
      co_await http::async_read(stream, buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
      if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == asio::error::eof ||
          ec == asio::error::connection_reset || ec == asio::error::operation_aborted)
        break;
      http::response<http::string_body> response;
      if (ec) {  // malformed, too large: answered and closed
        ++counters.badRequests;
        response.result(ec == http::error::body_limit ? http::status::payload_too_large
                                                      : http::status::bad_request);
        response.version(11);
        response.set(http::field::content_type, "text/plain; charset=utf-8");
        response.body() = "bad request: " + ec.message() + "\n";
        response.keep_alive(false);
        response.prepare_payload();
      } else {
        ++counters.requests;
        response = respond(parser.get());
        if (parser.get().method() == http::verb::head) response.body().clear();
      }
      stream.expires_after(options.requestTimeout);
      co_await http::async_write(stream, response, asio::redirect_error(asio::use_awaitable, ec));
      if (ec || !response.keep_alive()) break;
    }
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream.close();
    streams.erase(&stream);
    --counters.open;
  }

  asio::awaitable<void> acceptLoop() {
    auto self = shared_from_this();
    boost::system::error_code ec;
    while (!stopped) {
      tcp::socket socket(acceptor.get_executor());
      co_await acceptor.async_accept(socket, asio::redirect_error(asio::use_awaitable, ec));
      if (stopped) co_return;
      if (ec) {
        asio::steady_timer pause(acceptor.get_executor(), std::chrono::milliseconds(50));
        co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        continue;
      }
      if (counters.open >= options.maxConnections) {
        ++counters.refused;
        socket.close(ec);
        continue;
      }
      asio::co_spawn(acceptor.get_executor(), serve(std::move(socket)), [](std::exception_ptr e) {
        if (!e) return;
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& ex) {
          spdlog::warn("http: a connection ended with an error: {}", ex.what());
        }
      });
    }
  }
};

HttpServer::HttpServer(asio::io_context& io, const HttpOptions& options, Handler handler)
    : impl_(std::make_shared<Impl>(io, options, std::move(handler))) {
  const std::string where = options.address.toString();
  try {
    tcp::endpoint endpoint(asio::ip::make_address(options.address.host), options.address.port);
    impl_->acceptor.open(endpoint.protocol());
    impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
    impl_->acceptor.bind(endpoint);
    impl_->acceptor.listen();
  } catch (const boost::system::system_error& e) {
    throw NetworkError(options.setting + ": cannot listen on " + where + ": " + e.code().message());
  }
  asio::co_spawn(io, impl_->acceptLoop(), [](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      spdlog::error("http: accept loop failed: {}", ex.what());
    }
  });
}

HttpServer::~HttpServer() { impl_->stop(); }

void HttpServer::stop() { impl_->stop(); }

uint16_t HttpServer::port() const { return impl_->acceptor.local_endpoint().port(); }
const HttpCounters& HttpServer::counters() const { return impl_->counters; }

}  // namespace drun::rdzv::monitor

// HttpServer: a small GET server, Boost.Beast on its owner's io thread; the handler maps a path to
// a reply. Its users: drun-rendezvous --http ADDR:PORT (daemon/src/monitor: /metrics, /api/jobs,
// /api/jobs/ID, /healthz, the live page) and the agent's health check
// (TORCHELASTIC_HEALTH_CHECK_PORT: /healthz).
// With a token, every request proves it: "Authorization: Bearer <token>" or "?token=<token>"
// (compared in constant time), else 401.
//
// Limits: maxConnections at once (more are closed at accept and counted), a request's header at
// most 8 KiB and no body over 1 KiB (else 400 / 413), each request read within requestTimeout
// (else closed), at most 100 requests per connection. A malformed request is answered 400 and
// closed; nothing a peer sends can end the server.
// Threading: io thread only; handlers never block (responses are built from memory).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>

#include "drun/common/host_port.hpp"

namespace drun::rdzv::monitor {

struct HttpOptions {
  HostPort address{"127.0.0.1", 0};  // port 0 = any; see HttpServer::port()
  std::string token;  // "" = open
  size_t maxConnections = 64;
  std::chrono::milliseconds requestTimeout{10000};
  std::string serverName = "drun-rendezvous";  // the Server header
  std::string setting = "--http";              // what chose the address, for errors
};

struct HttpCounters {
  uint64_t requests = 0;
  uint64_t badRequests = 0;
  uint64_t unauthorized = 0;
  uint64_t refused = 0;  // over maxConnections
  uint64_t open = 0;
};

class HttpServer {
 public:
  // path (without the query) -> {content type, body, status}; "" content type = 404 (text).
  struct Reply {
    std::string contentType;
    std::string body;
    unsigned status = 200;
  };
  using Handler = std::function<Reply(const std::string& path)>;

  // Binds at once (NetworkError naming the address when it cannot); serves once the io runs.
  HttpServer(boost::asio::io_context& io, const HttpOptions& options, Handler handler);
  ~HttpServer();
  // Closes the listener and every connection (io thread, or once the io stopped): the io can end.
  void stop();
  uint16_t port() const;
  const HttpCounters& counters() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace drun::rdzv::monitor

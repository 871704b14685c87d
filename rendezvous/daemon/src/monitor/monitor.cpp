#include "monitor.hpp"

#include <boost/asio/post.hpp>

#include "drun/common/error.hpp"
#include "drun/common/host_port.hpp"
#include "metrics.hpp"
#include "page.hpp"

namespace drun::rdzv::monitor {

HttpOptions parseHttpAddress(const std::string& text) {
  HttpOptions o;
  // PORT and :PORT listen on the default host (loopback); anything else is HOST:PORT / [V6]:PORT.
  const bool portOnly = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  std::string full = text;
  if (portOnly) full = bracketedHost(o.host) + ":" + text;
  else if (text.starts_with(':')) full = bracketedHost(o.host) + text;
  const HostPort address = HostPort::parse(full, {"--http", std::nullopt, 0});
  o.host = address.host;
  o.port = address.port;
  return o;
}

Monitor::Monitor(StoreServer& server, HttpOptions options) : server_(server) {
  server.attach([&](boost::asio::io_context& io, StoreCore& core) {
    io_ = &io;
    jobs_ = std::make_unique<JobMonitor>();
    core.observeWrites([jobs = jobs_.get()](const std::string& key, const Bytes* value) {
      jobs->onWrite(key, value);
    });
    const StoreCore* store = &core;
    http_ = std::make_unique<HttpServer>(io, options, [this, store](const std::string& path) {
      if (path == "/metrics")
        return HttpServer::Reply{"text/plain; version=0.0.4; charset=utf-8",
                                 renderMetrics(server_.stats(), *jobs_, http_->counters(),
                                               store->jobIds().size())};
      if (path == "/api/jobs") {
        nlohmann::json body = jobs_->jobsJson();
        const StoreServerStats s = server_.stats();
        body["server"] = {{"connections", s.connectionsOpen}, {"stored_bytes", s.storedBytes},
                          {"jobs_in_store", store->jobIds()}};
        return HttpServer::Reply{"application/json",
                                 body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
      }
      if (path == "/" || path == "/index.html") return HttpServer::Reply{"text/html; charset=utf-8", kPageHtml};
      return HttpServer::Reply{};
    });
  });
}

Monitor::~Monitor() = default;

uint16_t Monitor::port() const { return http_->port(); }

void Monitor::stop() {
  boost::asio::post(*io_, [http = http_.get()] { http->stop(); });
}

}  // namespace drun::rdzv::monitor

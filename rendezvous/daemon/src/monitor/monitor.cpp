#include "monitor.hpp"

#include <boost/asio/post.hpp>

#include "drun/common/env.hpp"
#include "drun/common/error.hpp"
#include "metrics.hpp"
#include "page.hpp"

namespace drun::rdzv::monitor {

HttpOptions parseHttpAddress(const std::string& text) {
  HttpOptions o;
  std::string host = "127.0.0.1", port = text;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find("]:");
    if (close == std::string::npos) throw InvalidArgument("--http '" + text + "': expected [V6]:PORT");
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else if (const size_t colon = text.rfind(':'); colon != std::string::npos) {
    if (colon > 0) host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  o.host = host;
  o.port = static_cast<uint16_t>(env::parseInt(port, "--http port", 0, 65535));
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

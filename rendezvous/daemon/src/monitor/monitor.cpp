#include "monitor.hpp"

#include <boost/asio/post.hpp>

#include "drun/common/error.hpp"
#include "drun/common/host_port.hpp"
#include "drun/rendezvous/keys.hpp"
#include "metrics.hpp"
#include "page.hpp"

namespace drun::rdzv::monitor {
namespace {

constexpr std::string_view kJobPath = "/api/jobs/";

HttpServer::Reply jsonReply(const nlohmann::json& body, unsigned status = 200) {
  return {"application/json", body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), status};
}

}  // namespace

HttpOptions parseHttpAddress(const std::string& text) {
  HttpOptions o;
  // PORT and :PORT listen on the default host (loopback); anything else is HOST:PORT / [V6]:PORT.
  const bool portOnly = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  std::string full = text;
  if (portOnly) full = bracketedHost(o.address.host) + ":" + text;
  else if (text.starts_with(':')) full = bracketedHost(o.address.host) + text;
  o.address = HostPort::parse(full, {"--http", std::nullopt, 0});
  return o;
}

Monitor::Monitor(StoreServer& server, HttpOptions options)
    : server_(server), startedAt_(std::chrono::system_clock::now()), startedSteady_(std::chrono::steady_clock::now()) {
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
                                               store->jobIds().size(), startedAt_)};
      if (path == "/healthz") {
        const double uptime = std::chrono::duration<double>(std::chrono::steady_clock::now() - startedSteady_).count();
        const nlohmann::json body = {{"status", "ok"}, {"uptime_seconds", uptime},
                                     {"jobs", store->jobIds().size()},
                                     {"connections", server_.stats().connectionsOpen}};
        return jsonReply(body);
      }
      if (path.starts_with(kJobPath)) return jobReply(path.substr(kJobPath.size()));
      if (path == "/api/jobs") {
        nlohmann::json body = jobs_->jobsJson();
        const StoreServerStats s = server_.stats();
        body["server"] = {{"connections", s.connectionsOpen}, {"stored_bytes", s.storedBytes},
                          {"jobs_in_store", store->jobIds()}};
        return jsonReply(body);
      }
      if (path == "/" || path == "/index.html") return HttpServer::Reply{"text/html; charset=utf-8", kPageHtml};
      return HttpServer::Reply{};
    });
  });
}

Monitor::~Monitor() = default;

HttpServer::Reply Monitor::jobReply(const std::string& runId) const {
  const auto notFound = [](const std::string& why) { return jsonReply({{"error", why}}, 404); };
  try {
    keys::validateRunId(runId);
  } catch (const InvalidArgument&) {
    return notFound("not a job id: use 1 to 128 characters of letters, digits and _.:@+-");
  }
  auto it = jobs_->jobs().find(runId);
  if (it == jobs_->jobs().end()) return notFound("no job " + runId + " on this drun-rendezvous");
  nlohmann::json body = jobs_->summary(runId, it->second);
  body["history"] = it->second.events;
  return jsonReply(body);
}

uint16_t Monitor::port() const { return http_->port(); }

void Monitor::stop() {
  boost::asio::post(*io_, [http = http_.get()] { http->stop(); });
}

}  // namespace drun::rdzv::monitor

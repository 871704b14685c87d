#include "health_check.hpp"

#include <nlohmann/json.hpp>

#include "drun/rendezvous/http_server.hpp"

namespace drun::agent::detail {

std::string healthJson(const HealthStatus& s) {
  const nlohmann::json body = {{"state", s.state},
                               {"round", s.round},
                               {"world_size", s.worldSize},
                               {"restarts_used", s.restartsUsed},
                               {"max_restarts", s.maxRestarts},
                               {"workers_running", s.workersRunning},
                               {"run_id", s.runId},
                               {"hostname", s.hostname}};
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

HealthCheck::HealthCheck(boost::asio::io_context& io, uint16_t port, std::function<HealthStatus()> status) {
  rdzv::monitor::HttpOptions options;
  options.address = {"0.0.0.0", port};
  options.serverName = "drun";
  options.setting = "TORCHELASTIC_HEALTH_CHECK_PORT (the agent's health check)";
  auto handler = [status = std::move(status)](const std::string& path) {
    if (path == "/healthz") return rdzv::monitor::HttpServer::Reply{"application/json", healthJson(status()) + "\n"};
    return rdzv::monitor::HttpServer::Reply{};
  };
  server_ = std::make_unique<rdzv::monitor::HttpServer>(io, options, std::move(handler));
}

HealthCheck::~HealthCheck() = default;

uint16_t HealthCheck::port() const { return server_->port(); }

void HealthCheck::stop() { server_->stop(); }

}  // namespace drun::agent::detail

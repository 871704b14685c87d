// HealthCheck: the agent's answer to TORCHELASTIC_HEALTH_CHECK_PORT (torchrun's variable; its
// open-source server is a stub). GET /healthz answers 200 with the agent's status as JSON while the
// agent runs; any other path 404. Served by the rendezvous' HttpServer on the agent's event loop,
// on every interface (a health checker usually probes from outside the host); it tells nothing but
// the job's progress.
//
// Threading: the agent's io thread; `status` runs there and must not block. Ownership: owns the
// server; stop() (on the loop, or once it stopped) closes the listener and its connections.
#pragma once

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace drun::rdzv::monitor {
class HttpServer;
}  // namespace drun::rdzv::monitor

namespace drun::agent::detail {

struct HealthStatus {
  std::string state;        // the agent's state (Rendezvous, Running, ...)
  uint64_t round = 0;       // the rendezvous round it runs or last ran
  int worldSize = 0;        // that round's world size (0 before the first)
  int restartsUsed = 0;     // of the job's budget
  int maxRestarts = 0;
  int workersRunning = 0;   // this node's
  std::string runId;
  std::string hostname;
};

// {"state":..., "round":..., "world_size":..., "restarts_used":..., "max_restarts":...,
//  "workers_running":..., "run_id":..., "hostname":...}
std::string healthJson(const HealthStatus& status);

class HealthCheck {
 public:
  // Listens at once; throws drun::NetworkError naming the variable and the port when it cannot
  // (in use).
  HealthCheck(boost::asio::io_context& io, uint16_t port, std::function<HealthStatus()> status);
  ~HealthCheck();
  HealthCheck(const HealthCheck&) = delete;
  HealthCheck& operator=(const HealthCheck&) = delete;

  uint16_t port() const;
  void stop();

 private:
  std::unique_ptr<rdzv::monitor::HttpServer> server_;
};

}  // namespace drun::agent::detail

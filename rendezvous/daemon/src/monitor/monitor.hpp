// Monitor: drun-rendezvous --http, whole: a JobMonitor fed by the store's writes and an
// HttpServer answering /metrics, /api/jobs, /api/jobs/ID, /healthz and / from it, both on the store server's io thread.
// Threading: created before the server starts; stop() from any thread before the server stops
// (it posts to the io). Ownership: owns both; the StoreServer must outlive it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "drun/store/store_server.hpp"
#include "drun/rendezvous/http_server.hpp"
#include "job_monitor.hpp"

namespace drun::rdzv::monitor {

// "ADDR:PORT", "[V6]:PORT", ":PORT" or "PORT" (loopback): the listening address. Throws
// InvalidArgument naming --http.
HttpOptions parseHttpAddress(const std::string& text);

class Monitor {
 public:
  Monitor(StoreServer& server, HttpOptions options);
  ~Monitor();
  uint16_t port() const;
  void stop();  // closes the HTTP side so that the io can end

 private:
  HttpServer::Reply jobReply(const std::string& runId) const;  // /api/jobs/ID

  StoreServer& server_;
  std::chrono::system_clock::time_point startedAt_;  // the monitor starts with the daemon
  std::chrono::steady_clock::time_point startedSteady_;
  boost::asio::io_context* io_ = nullptr;
  std::unique_ptr<JobMonitor> jobs_;
  std::unique_ptr<HttpServer> http_;
};

}  // namespace drun::rdzv::monitor

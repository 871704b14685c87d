// The Prometheus text format (version 0.0.4) of drun-rendezvous --http's /metrics: the store
// server's counters, each job (label rdzv_id): its state, size, rounds, restarts by cause, lost
// nodes and hangs; the round-close latency histogram, the build and the process start time.
// Threading: pure function of its inputs (the caller reads them on the io thread).
#pragma once

#include <chrono>
#include <string>

#include "drun/store/store_server.hpp"
#include "drun/rendezvous/http_server.hpp"
#include "job_monitor.hpp"

namespace drun::rdzv::monitor {

std::string renderMetrics(const StoreServerStats& stats, const JobMonitor& jobs,
                          const HttpCounters& http, size_t jobsInStore,
                          std::chrono::system_clock::time_point startedAt);

}  // namespace drun::rdzv::monitor

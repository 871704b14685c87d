// The Prometheus text format (version 0.0.4) of drun-rendezvous --http's /metrics: the store
// server's counters, the jobs and their rounds and restarts, the round-close latency histogram.
// Threading: pure function of its inputs (the caller reads them on the io thread).
#pragma once

#include <string>

#include "drun/store/store_server.hpp"
#include "drun/rendezvous/http_server.hpp"
#include "job_monitor.hpp"

namespace drun::rdzv::monitor {

std::string renderMetrics(const StoreServerStats& stats, const JobMonitor& jobs,
                          const HttpCounters& http, size_t jobsInStore);

}  // namespace drun::rdzv::monitor

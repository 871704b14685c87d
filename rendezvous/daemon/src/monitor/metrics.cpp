#include "metrics.hpp"

#include <cstdio>

namespace drun::rdzv::monitor {
namespace {

// A label value: \ " and newline escaped (run ids cannot hold them; keys written by others may).
std::string label(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

struct Writer {
  std::string out;
  void family(const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(const std::string& name, double value, const std::string& labels = "") {
    char number[64];
    std::snprintf(number, sizeof number, "%.17g", value);
    out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + number + "\n";
  }
  void single(const char* name, const char* type, const char* help, double value) {
    family(name, type, help);
    sample(name, value);
  }
};

}  // namespace

std::string renderMetrics(const StoreServerStats& s, const JobMonitor& jobs, const HttpCounters& http,
                          size_t jobsInStore) {
  Writer w;
  w.single("drun_rdzv_connections", "gauge", "store connections open (admitted and pending)",
           double(s.connectionsOpen));
  w.single("drun_rdzv_connections_accepted_total", "counter", "store connections accepted",
           double(s.connectionsAccepted));
  w.single("drun_rdzv_connections_refused_total", "counter",
           "store connections refused: over a connection limit, or a wrong or missing token",
           double(s.connectionsRefused + s.authRefused));
  w.single("drun_rdzv_requests_total", "counter", "store requests served", double(s.requestsServed));
  w.single("drun_rdzv_protocol_errors_total", "counter", "connections closed for malformed input",
           double(s.protocolErrors));
  w.single("drun_rdzv_leases_expired_total", "counter", "connections closed for silence",
           double(s.leasesExpired));
  w.single("drun_rdzv_wills_run_total", "counter", "wills run (a client's connection closed or lapsed)",
           double(s.willsRun));
  w.single("drun_rdzv_stored_bytes", "gauge", "keys + values (+ per-key overhead) the store holds",
           double(s.storedBytes));
  w.single("drun_rdzv_held_bytes", "gauge",
           "bytes held for clients: stored, buffered input, queued output, blocking calls and wills",
           double(s.storedBytes + s.inputBytesBuffered + s.outputBytesQueued + s.callBytesHeld));
  w.single("drun_rdzv_jobs", "gauge", "jobs with keys in the store", double(jobsInStore));

  w.family("drun_rdzv_job_rounds_total", "counter", "rounds closed per job (since the daemon started)");
  for (const auto& [id, job] : jobs.jobs())
    w.sample("drun_rdzv_job_rounds_total", double(job.roundsClosed), "job=\"" + label(id) + "\"");
  w.family("drun_rdzv_job_restarts", "gauge", "restarts the job used (its latest round's decision)");
  for (const auto& [id, job] : jobs.jobs())
    w.sample("drun_rdzv_job_restarts", double(job.restarts), "job=\"" + label(id) + "\"");
  w.family("drun_rdzv_job_cancels_total", "counter",
           "nodes of the job cancelled: SIGTERM/SIGINT to their drun or to all their workers");
  for (const auto& [id, job] : jobs.jobs())
    w.sample("drun_rdzv_job_cancels_total", double(job.cancels), "job=\"" + label(id) + "\"");

  w.family("drun_rdzv_round_close_seconds", "histogram",
           "from a round's first joiner to its decision, every job");
  const auto counts = jobs.closeBucketCounts();
  for (size_t i = 0; i < kCloseBuckets.size(); ++i) {
    char le[32];
    std::snprintf(le, sizeof le, "%g", kCloseBuckets[i]);
    w.sample("drun_rdzv_round_close_seconds_bucket", double(counts[i]), std::string("le=\"") + le + "\"");
  }
  w.sample("drun_rdzv_round_close_seconds_bucket", double(jobs.closeCount()), "le=\"+Inf\"");
  w.sample("drun_rdzv_round_close_seconds_sum", jobs.closeSecondsSum());
  w.sample("drun_rdzv_round_close_seconds_count", double(jobs.closeCount()));

  w.single("drun_rdzv_http_requests_total", "counter", "HTTP requests served (this endpoint)",
           double(http.requests));
  w.single("drun_rdzv_http_bad_requests_total", "counter", "malformed HTTP requests answered 400",
           double(http.badRequests));
  w.single("drun_rdzv_http_refused_total", "counter", "HTTP connections refused over the limit",
           double(http.refused));
  return w.out;
}

}  // namespace drun::rdzv::monitor

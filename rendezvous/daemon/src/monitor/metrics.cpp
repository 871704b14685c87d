#include "metrics.hpp"

#include <cstdio>
#include <utility>
#include <vector>

#include "drun/common/version.hpp"

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

// The states of summarizeJob, each a series of drun_rdzv_job_state.
constexpr const char* kJobStates[] = {"forming", "running", "recovering", "restarting",
                                      "succeeded", "failed", "cancelled", "ended"};

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

std::string jobLabel(const std::string& runId) { return "rdzv_id=\"" + label(runId) + "\""; }

// The per-job families: each job's series labelled rdzv_id (Prometheus sets `job` itself).
void renderJobs(Writer& w, const JobMonitor& jobs) {
  std::vector<std::pair<std::string, nlohmann::json>> summaries;
  for (const auto& [id, job] : jobs.jobs()) summaries.emplace_back(id, jobs.summary(id, job));
  auto perJob = [&](const char* name, const char* type, const char* help, auto value) {
    w.family(name, type, help);
    for (const auto& [id, job] : jobs.jobs()) w.sample(name, double(value(job)), jobLabel(id));
  };
  auto perSummary = [&](const char* name, const char* help, auto value) {
    w.family(name, "gauge", help);
    for (const auto& [id, s] : summaries) w.sample(name, double(value(s)), jobLabel(id));
  };
  w.family("drun_rdzv_job_state", "gauge", "1 for the job's current state, 0 for the others");
  for (const auto& [id, s] : summaries)
    for (const char* state : kJobStates)
      w.sample("drun_rdzv_job_state", s["state"] == state ? 1 : 0,
               jobLabel(id) + ",state=\"" + state + "\"");
  perSummary("drun_rdzv_job_world_size", "workers in the job's current round",
             [](const nlohmann::json& s) { return s["world_size"].get<int64_t>(); });
  perSummary("drun_rdzv_job_nodes", "nodes in the job's current round",
             [](const nlohmann::json& s) { return s["node_count"].get<int64_t>(); });
  perSummary("drun_rdzv_job_waiting_nodes", "nodes waiting to join the job (spares, late joiners)",
             [](const nlohmann::json& s) { return s["waiting"].size(); });
  perJob("drun_rdzv_job_rounds_total", "counter", "rounds closed per job (since the daemon started)",
         [](const JobMonitor::Job& j) { return j.roundsClosed; });
  perJob("drun_rdzv_job_restarts", "gauge", "restarts the job used (its latest round's decision)",
         [](const JobMonitor::Job& j) { return j.restarts; });
  perJob("drun_rdzv_job_cancels_total", "counter",
         "nodes of the job cancelled: SIGTERM/SIGINT to their drun or to all their workers",
         [](const JobMonitor::Job& j) { return j.cancels; });
  perJob("drun_rdzv_job_lost_nodes_total", "counter", "nodes the job lost (each loss once)",
         [](const JobMonitor::Job& j) { return j.counters.lostNodes(); });
  perJob("drun_rdzv_job_hangs_total", "counter", "hung ranks detected in the job",
         [](const JobMonitor::Job& j) { return j.counters.hangs(); });
  w.family("drun_rdzv_job_round_restarts_total", "counter",
           "rounds the job re-formed, by what ended the round before: failure, node_lost, scale_up, "
           "store_lost, other");
  for (const auto& [id, job] : jobs.jobs())
    for (const auto& [cause, n] : job.counters.restartsByCause())
      w.sample("drun_rdzv_job_round_restarts_total", double(n), jobLabel(id) + ",cause=\"" + cause + "\"");
}

}  // namespace

std::string renderMetrics(const StoreServerStats& s, const JobMonitor& jobs, const HttpCounters& http,
                          size_t jobsInStore, std::chrono::system_clock::time_point startedAt) {
  Writer w;
  w.family("drun_build_info", "gauge", "1, labelled with the drun-rendezvous version");
  w.sample("drun_build_info", 1, "version=\"" + label(kVersion) + "\"");
  w.single("process_start_time_seconds", "gauge", "when the process started, seconds since the epoch",
           std::chrono::duration<double>(startedAt.time_since_epoch()).count());
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

  renderJobs(w, jobs);
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

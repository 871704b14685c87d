// End-to-end tests of a cancelled job: SIGTERM or SIGINT from outside, to drun or to every worker
// of a node at once (slurmstepd under scancel signals the workers directly), ends the job as
// `cancelled`, not failed: drun's last line, its exit code (128 + the signal, as a shell's), the
// job_cancelled event, `drun status`, the daemon's /api/jobs and /metrics. A signal to one worker
// only stays a failure with its root cause. Every run carries a marker (MarkerScope).
#include <signal.h>

#include <regex>

#include "observe_support.hpp"

// Its own namespace: the unity build shares the file scope with other tests (their Daemon).
namespace drun::test::cancel_e2e {

using namespace drun::test::observe;
using namespace std::chrono_literals;

namespace {

// Each worker says "READY <rank> <pid>" and sleeps (the pid is the worker's: `exec`).
const std::vector<std::string> kSleepingWorker = {"/bin/sh", "-c",
                                                  "echo READY $RANK $$; exec sleep 120"};

std::unique_ptr<Process> jobOn(const Daemon& daemon, const MarkerScope& marker, const std::string& runId,
                               const std::filesystem::path& events, const std::string& maxRestarts = "3") {
  std::vector<std::string> argv = {drunPath().string(), "--nnodes", "1", "--rdzv-endpoint",
                                   "127.0.0.1:" + std::to_string(daemon.storePort), "--rdzv-id", runId,
                                   "--max-restarts", maxRestarts, "--nproc-per-node", "2", "--events",
                                   events.string()};
  argv.insert(argv.end(), kSleepingWorker.begin(), kSleepingWorker.end());
  return std::make_unique<Process>(RunOptions{.argv = argv, .env = {marker.env()}, .timeout = 60s});
}

// The two workers' pids, once both said READY (empty after 30 s).
std::vector<pid_t> workerPids(Process& job) {
  static const std::regex ready(R"(READY \d+ (\d+))");
  std::vector<pid_t> pids;
  job.waitForOutput([&](const std::string& out, const std::string&) {
    pids.clear();
    for (std::sregex_iterator it(out.begin(), out.end(), ready), end; it != end; ++it)
      pids.push_back(static_cast<pid_t>(std::stol((*it)[1])));
    return pids.size() == 2;
  }, 30s);
  return pids.size() == 2 ? pids : std::vector<pid_t>{};
}

RunResult statusOf(const Daemon& daemon, const std::string& runId) {
  return run({.argv = {drunPath().string(), "status", "--rdzv-endpoint",
                       "127.0.0.1:" + std::to_string(daemon.storePort), "--rdzv-id", runId},
              .timeout = 20s});
}

json apiJob(const Daemon& daemon, const std::string& runId) {
  json jobs = json::parse(bodyOf(httpGet(daemon.httpPort, "/api/jobs")), nullptr, false);
  if (!jobs.is_discarded())
    for (const json& j : jobs["jobs"])
      if (j["run_id"] == runId) return j;
  return json();
}

// What every cancelled run shows: its status, the daemon's view of it, its one event.
void checkCancelled(const Daemon& daemon, const std::string& runId, const std::filesystem::path& events,
                    const std::string& by, int code) {
  const auto ended = ofKind(readEvents(events), "job_cancelled");
  REQUIRE(ended.size() == 1);
  CHECK(ended[0]["code"] == code);
  CHECK(ended[0]["by"].get<std::string>().find(by) != std::string::npos);
  CHECK(ofKind(readEvents(events), "job_failed").empty());
  CHECK(ofKind(readEvents(events), "failure_recorded").empty());
  RunResult status = statusOf(daemon, runId);
  INFO(status.describe());
  CHECK(status.status() == 0);
  CHECK(contains(status.out, "job " + runId + ": cancelled\n"));
  CHECK(contains(status.out, "  cancelled: " + by));
  CHECK(contains(status.out, "last root cause: none"));
  CHECK(eventually([&] { return apiJob(daemon, runId)["state"] == "cancelled"; }, 10s));
  const json api = apiJob(daemon, runId);
  INFO(api.dump());
  REQUIRE(api["cancelled"].size() == 1);
  CHECK(api["cancelled"][0]["by"].get<std::string>().find(by) != std::string::npos);
  for (const json& round : api["rounds"]) CHECK(round["lost"].empty());
  const std::string metrics = bodyOf(httpGet(daemon.httpPort, "/metrics"));
  CHECK(contains(metrics, "drun_rdzv_job_cancels_total{rdzv_id=\"" + runId + "\"} 1\n"));
  CHECK(contains(metrics, "drun_rdzv_job_state{rdzv_id=\"" + runId + "\",state=\"cancelled\"} 1\n"));
}

}  // namespace

TEST_CASE("cancel: SIGTERM to drun ends the job cancelled (exit 143): its last line, event, drun status, "
          "/api/jobs, /metrics", "[e2e]") {
  Daemon daemon;
  MarkerScope marker;
  TempDir dir;
  auto job = jobOn(daemon, marker, "cancel1", dir / "events");
  REQUIRE(job->waitForLines("READY", 2, 30s));
  job->signal(SIGTERM);
  RunResult r = job->wait(30s);
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 143);
  CHECK(contains(r.err, "drun: job cancelled: SIGTERM to drun (pid "));
  CHECK_FALSE(contains(r.err, "root cause"));
  checkCancelled(daemon, "cancel1", dir / "events", "SIGTERM to drun (pid ", 143);
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("cancel: SIGINT to every worker at once (slurmstepd under scancel) ends the job cancelled "
          "(exit 130), no root cause", "[e2e]") {
  Daemon daemon;
  MarkerScope marker;
  TempDir dir;
  auto job = jobOn(daemon, marker, "cancel2", dir / "events");
  const std::vector<pid_t> pids = workerPids(*job);
  REQUIRE(pids.size() == 2);
  for (pid_t pid : pids) ::kill(pid, SIGINT);
  RunResult r = job->wait(30s);
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 130);
  CHECK(contains(r.err, "drun: job cancelled: SIGINT to all 2 worker(s) on "));
  CHECK_FALSE(contains(r.err, "root cause"));
  CHECK_FALSE(contains(r.err, "restarting"));
  checkCancelled(daemon, "cancel2", dir / "events", "SIGINT to all 2 worker(s) on ", 130);
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("cancel: SIGTERM to one worker of two is a failure with its root cause, not a cancel", "[e2e]") {
  Daemon daemon;
  MarkerScope marker;
  TempDir dir;
  auto job = jobOn(daemon, marker, "cancel3", dir / "events", "0");
  const std::vector<pid_t> pids = workerPids(*job);
  REQUIRE(pids.size() == 2);
  ::kill(pids[0], SIGTERM);
  RunResult r = job->wait(30s);
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 128 + SIGTERM);  // the root cause's status, as for any failure
  CHECK(contains(r.err, "drun: root cause: rank "));
  CHECK(contains(r.err, "was killed by signal SIGTERM"));
  CHECK_FALSE(contains(r.err, "cancelled"));
  CHECK(ofKind(readEvents(dir / "events"), "job_cancelled").empty());
  CHECK(ofKind(readEvents(dir / "events"), "job_failed").size() == 1);
  CHECK(eventually([&] { return apiJob(daemon, "cancel3")["state"] == "failed"; }, 10s));
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("cancel: namespace hosts: SIGTERM to every node's drun: each exits 143, the job is "
          "cancelled, with no lost node, in drun status from either node", "[e2e][multinode]") {
  if (auto why = NetnsCluster::unavailableReason()) skipTest("multi-node test: " + *why);
  NetnsCluster cluster(3);
  MarkerScope marker;
  TempDir dir;
  // The store is a daemon on host 2: it outlives the job, so its history can be read after it.
  const std::string endpoint = cluster.address(2) + ":29541";
  Process daemon(RunOptions{.argv = cluster.exec(2, {(buildDir() / "bin" / "drun-rendezvous").string(),
                                                     "--host", cluster.address(2), "--port", "29541"}),
                            .timeout = 120s});
  REQUIRE(daemon.waitForOutput([](const std::string& out, const std::string&) {
    return contains(out, "listening on");
  }, 10s));
  auto node = [&](int host) {
    return startNamespaceNode(cluster, host, dir.path(), endpoint, "cancel4", "2", "join_timeout=30",
                              marker);
  };
  auto a = node(0);
  auto b = node(1);
  REQUIRE(eventually([&] {
    return fileHas(dir / "events0", "\"worker_started\"") && fileHas(dir / "events1", "\"worker_started\"");
  }, 30s));
  b->signal(SIGTERM);
  a->signal(SIGTERM);
  RunResult ra = a->wait(30s), rb = b->wait(30s);
  INFO(ra.describe() << rb.describe());
  CHECK(ra.status() == 143);
  CHECK(rb.status() == 143);
  for (const RunResult* r : {&ra, &rb}) {
    CHECK(contains(r->err, "drun: job cancelled: SIGTERM to drun (pid "));
    CHECK_FALSE(contains(r->err, "root cause"));
  }
  for (int host : {0, 1}) {
    const auto events = readEvents(dir / ("events" + std::to_string(host)));
    CHECK(ofKind(events, "job_cancelled").size() == 1);
    CHECK(ofKind(events, "job_failed").empty());
    RunResult text = run({.argv = cluster.exec(host, {drunPath().string(), "status", "--rdzv-endpoint",
                                                      endpoint, "--rdzv-id", "cancel4"}),
                          .timeout = 20s});
    RunResult js = run({.argv = cluster.exec(host, {drunPath().string(), "status", "--rdzv-endpoint",
                                                    endpoint, "--rdzv-id", "cancel4", "--json"}),
                        .timeout = 20s});
    INFO(text.describe() << js.describe());
    CHECK(contains(text.out, "job cancel4: cancelled\n"));
    CHECK(contains(text.out, "  cancelled: SIGTERM to drun (pid "));
    json j = json::parse(js.out, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    CHECK(j["state"] == "cancelled");
    CHECK(j["cancelled"].size() == 2);
    for (const json& round : j["rounds"]) CHECK(round["lost"].empty());
  }
  daemon.signal(SIGTERM);
  daemon.wait(10s);
  CHECK(marker.leftovers(5s).empty());
}

}  // namespace drun::test::cancel_e2e

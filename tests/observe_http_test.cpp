// Watching a job (docs/observe.md): drun-rendezvous --http while a job fails
// and restarts: /metrics parsed by prometheus_client's parser and checked by promtool, one job's
// JSON, /healthz, the page in headless chromium, the token and malformed requests.
#include "observe_support.hpp"

#include "drun/common/version.hpp"

using namespace drun::test;
using namespace drun::test::observe;

namespace {

// A job on `daemon` whose rank 1 fails once with exit code 7, then waits for `go`; returns once
// the daemon's /api/jobs shows round 1 with the root cause.
std::unique_ptr<Process> failedOnceJob(const Daemon& daemon, const MarkerScope& marker,
                                       const std::string& runId, const std::string& go) {
  std::vector<std::string> argv = {drunPath().string(), "--nnodes", "1", "--rdzv-endpoint",
                                   "127.0.0.1:" + std::to_string(daemon.storePort), "--rdzv-id", runId,
                                   "--max-restarts", "2", "--nproc-per-node", "2"};
  for (const auto& a : failOnceThenWait(1, 7, go)) argv.push_back(a);
  auto job = std::make_unique<Process>(RunOptions{.argv = argv, .env = {marker.env()}, .timeout = 90s});
  bool shown = eventually([&] {
    json jobs = json::parse(bodyOf(httpGet(daemon.httpPort, "/api/jobs")), nullptr, false);
    if (jobs.is_discarded()) return false;
    for (const json& j : jobs["jobs"])
      if (j["run_id"] == runId && j["round"] == 1 && j["last_root_cause"].is_object() &&
          j["state"] == "running")
        return true;
    return false;
  }, 30s);
  REQUIRE(shown);
  return job;
}

bool hasCommand(const std::string& name) {
  return std::system(("command -v " + name + " >/dev/null 2>&1").c_str()) == 0;
}

}  // namespace

TEST_CASE("drun-rendezvous --http: /metrics parses as Prometheus text while a job restarts", "[observe]") {
  if (std::system("/usr/bin/python3 -c 'import prometheus_client' 2>/dev/null") != 0)
    skipTest("python3-prometheus-client is not installed (scripts/setup.sh --tests installs it)");
  MarkerScope marker;
  TempDir dir;
  Daemon daemon;
  auto job = failedOnceJob(daemon, marker, "obs4", (dir / "go").string());
  const std::string response = httpGet(daemon.httpPort, "/metrics");
  INFO(response);
  REQUIRE(response.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(response.find("Content-Type: text/plain; version=0.0.4") != std::string::npos);
  dir.write("metrics.txt", bodyOf(response));
  const std::string check = R"PY(
import sys, time
from prometheus_client.parser import text_string_to_metric_families
fams = {f.name: f for f in text_string_to_metric_families(open(sys.argv[1]).read())}
def value(name, sample=None, **labels):
    for s in fams[name].samples:
        if s.name == (sample or name) and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise SystemExit("missing %s %s" % (sample or name, labels))
assert fams["drun_rdzv_connections"].type == "gauge"
assert value("drun_rdzv_connections") >= 1, "connections"
assert value("drun_rdzv_jobs") == 1, "jobs"
assert value("drun_rdzv_job_rounds", "drun_rdzv_job_rounds_total", rdzv_id="obs4") == 2, "rounds"
assert value("drun_rdzv_job_restarts", rdzv_id="obs4") == 1, "restarts"
assert not any("job" in s.labels for f in fams.values() for s in f.samples), "no label job"
assert value("drun_rdzv_job_state", rdzv_id="obs4", state="running") == 1, "state running"
for other in ("forming", "succeeded", "failed", "cancelled"):
    assert value("drun_rdzv_job_state", rdzv_id="obs4", state=other) == 0, other
assert value("drun_rdzv_job_world_size", rdzv_id="obs4") == 2, "world size"
assert value("drun_rdzv_job_nodes", rdzv_id="obs4") == 1, "nodes"
assert value("drun_rdzv_job_waiting_nodes", rdzv_id="obs4") == 0, "waiting"
assert fams["drun_rdzv_job_round_restarts"].type == "counter"
assert value("drun_rdzv_job_round_restarts", "drun_rdzv_job_round_restarts_total", rdzv_id="obs4", cause="failure") == 1
assert value("drun_rdzv_job_round_restarts", "drun_rdzv_job_round_restarts_total", rdzv_id="obs4", cause="node_lost") == 0
assert value("drun_rdzv_job_lost_nodes", "drun_rdzv_job_lost_nodes_total", rdzv_id="obs4") == 0, "lost"
assert value("drun_rdzv_job_hangs", "drun_rdzv_job_hangs_total", rdzv_id="obs4") == 0, "hangs"
assert value("drun_build_info", version=sys.argv[2]) == 1, "build info"
assert abs(value("process_start_time_seconds") - time.time()) < 600, "start time"
assert fams["drun_rdzv_round_close_seconds"].type == "histogram"
assert value("drun_rdzv_round_close_seconds", "drun_rdzv_round_close_seconds_count") == 2, "closes"
assert value("drun_rdzv_round_close_seconds", "drun_rdzv_round_close_seconds_bucket", le="+Inf") == 2
assert value("drun_rdzv_connections_refused", "drun_rdzv_connections_refused_total") == 0
assert value("drun_rdzv_held_bytes") > 0
print("metrics ok")
)PY";
  RunResult parsed = run({.argv = {"/usr/bin/python3", "-c", check, (dir / "metrics.txt").string(), drun::kVersion}});
  INFO(parsed.describe());
  CHECK(parsed.out.find("metrics ok") != std::string::npos);
  // The job alone: its summary, its rounds' times and exits, its events.
  json one = json::parse(bodyOf(httpGet(daemon.httpPort, "/api/jobs/obs4")), nullptr, false);
  REQUIRE(one.is_object());
  CHECK(one["run_id"] == "obs4");
  CHECK(one["state"] == "running");
  REQUIRE(one["rounds"].size() == 2);
  CHECK(one["rounds"][0]["ended_ts_ms"].get<int64_t>() >= one["rounds"][0]["ts_ms"].get<int64_t>());
  CHECK(one["rounds"][1]["ended_ts_ms"].is_null());
  bool exit7 = false;
  for (const json& x : one["rounds"][0]["exits"]) exit7 = exit7 || (x["rank"] == 1 && x["code"] == 7);
  CHECK(exit7);
  CHECK(one["history"].size() == one["events"].get<size_t>());
  CHECK(one["history"][0]["event"] == "node_joining");
  std::ofstream(dir / "go").put('\n');
  CHECK(job->wait().status() == 0);
  // The ended job keeps its tombstone and its history in the store (until --orphan-ttl):
  // drun status and the page say how it ended.
  RunResult status = run({.argv = {drunPath().string(), "status", "--rdzv-endpoint",
                                   "127.0.0.1:" + std::to_string(daemon.storePort)},
                          .timeout = 20s});
  INFO(status.describe());
  CHECK(std::regex_search(status.out, std::regex(R"(\nobs4 +succeeded +1 +2 +1 +1/2  rank 1 on \S+: exit code 7\n)")));
  json jobs = json::parse(bodyOf(httpGet(daemon.httpPort, "/api/jobs")));
  REQUIRE(jobs["jobs"].size() == 1);
  CHECK(jobs["jobs"][0]["state"] == "succeeded");
}

TEST_CASE("drun-rendezvous --http: the page shows the round and the root cause in headless chromium", "[observe]") {
  std::string chromium = hasCommand("chromium") ? "chromium" : hasCommand("chromium-browser") ? "chromium-browser" : "";
  if (chromium.empty()) skipTest("chromium is not installed (scripts/setup.sh --tests installs it)");
  MarkerScope marker;
  TempDir dir;
  Daemon daemon;
  auto job = failedOnceJob(daemon, marker, "obs5", (dir / "go").string());
  const std::string url = "http://127.0.0.1:" + std::to_string(daemon.httpPort) + "/";
  auto browse = [&](const std::string& what) {
    return run({.argv = {"/usr/bin/env", chromium, "--headless", "--no-sandbox", "--disable-gpu",
                         "--no-proxy-server", "--user-data-dir=" + (dir / "profile").string(),
                         "--virtual-time-budget=4000", "--window-size=1100,620", what, url},
                .env = {"HOME=" + dir.path().string()},
                .timeout = 90s});
  };
  RunResult dom = browse("--dump-dom");
  INFO(dom.describe());
  REQUIRE(!dom.timedOut);
  CHECK(dom.out.find("data-run-id=\"obs5\"") != std::string::npos);
  CHECK(dom.out.find("data-round=\"0\"") != std::string::npos);
  CHECK(dom.out.find("data-round=\"1\"") != std::string::npos);
  CHECK(std::regex_search(dom.out, std::regex(R"(data-root-cause="rank 1 on [^"]+: exit code 7)")));
  CHECK(dom.out.find("last root cause: rank 1 on") != std::string::npos);
  CHECK(dom.out.find("restarts 1 of 2") != std::string::npos);
  // Times: the job's start, each round's start and (when it ended) its end; per-rank exits; the
  // nodes' addresses beside their host names.
  CHECK(std::regex_search(dom.out, std::regex(R"(data-started-ms="\d{13}")")));
  CHECK(std::regex_search(dom.out, std::regex(R"(elapsed (\d+m )?\d+s)")));
  CHECK(std::regex_search(dom.out, std::regex(R"(data-round="0" data-start-ms="\d{13}" data-end-ms="\d{13}")")));
  CHECK(std::regex_search(dom.out, std::regex(R"(data-round="1" data-start-ms="\d{13}" data-end-ms="")")));
  CHECK(dom.out.find(R"(data-rank="1" data-exit="exit 7")") != std::string::npos);
  CHECK(std::regex_search(dom.out, std::regex(R"(data-address="127\.0\.0\.1")")));
  const auto shot = buildDir() / "tests" / "observe_page.png";
  RunResult png = browse("--screenshot=" + shot.string());
  INFO(png.describe());
  CHECK(std::filesystem::exists(shot));
  CHECK(std::filesystem::file_size(shot) > 1000);
  std::ofstream(dir / "go").put('\n');
  CHECK(job->wait().status() == 0);
}

TEST_CASE("drun-rendezvous --http: the token guards it, malformed and oversized requests get 400, at most 64 connections", "[observe]") {
  TempDir dir;
  const auto token = dir.write("token", "0123456789abcdef0123456789abcdef\n");
  Daemon daemon({"--token-file", token.string()});
  CHECK(httpGet(daemon.httpPort, "/metrics").rfind("HTTP/1.1 401", 0) == 0);
  CHECK(httpGet(daemon.httpPort, "/metrics?token=wrong").rfind("HTTP/1.1 401", 0) == 0);
  CHECK(httpGet(daemon.httpPort, "/api/jobs?token=0123456789abcdef0123456789abcdef").rfind("HTTP/1.1 200", 0) == 0);
  CHECK(httpGet(daemon.httpPort, "/", "Authorization: Bearer 0123456789abcdef0123456789abcdef\r\n")
            .rfind("HTTP/1.1 200", 0) == 0);
  CHECK(httpGet(daemon.httpPort, "RAW:GARBAGE\r\n\r\n").rfind("HTTP/1.1 400", 0) == 0);
  CHECK(httpGet(daemon.httpPort, "RAW:GET / HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n")
            .rfind("HTTP/1.1 400", 0) == 0);
  CHECK(httpGet(daemon.httpPort, "RAW:POST / HTTP/1.1\r\nContent-Length: 100000\r\n\r\n")
            .rfind("HTTP/1.1 413", 0) == 0);
  // Still serving, and the store too.
  CHECK(httpGet(daemon.httpPort, "/nothing?token=0123456789abcdef0123456789abcdef").rfind("HTTP/1.1 404", 0) == 0);
  RunResult status = run({.argv = {drunPath().string(), "status", "--rdzv-endpoint",
                                   "127.0.0.1:" + std::to_string(daemon.storePort), "--token-file",
                                   token.string()},
                          .timeout = 20s});
  INFO(status.describe());
  CHECK(status.status() == 0);
  CHECK(status.out == "no jobs on 127.0.0.1:" + std::to_string(daemon.storePort) + "\n");
  // At most 64 connections: the 65th is closed at once, counted; the others are not disturbed.
  std::vector<int> idle;
  for (int i = 0; i < 64; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(daemon.httpPort);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    idle.push_back(fd);
  }
  REQUIRE(eventually([&] { return httpGet(daemon.httpPort, "/metrics?token=0123456789abcdef0123456789abcdef").empty(); }, 5s));
  for (int fd : idle) ::close(fd);
  std::string metrics;
  REQUIRE(eventually([&] {
    metrics = httpGet(daemon.httpPort, "/metrics?token=0123456789abcdef0123456789abcdef");
    return metrics.rfind("HTTP/1.1 200", 0) == 0;
  }, 5s));
  CHECK(std::regex_search(metrics, std::regex(R"(\ndrun_rdzv_http_refused_total [1-9])")));
  CHECK(std::regex_search(metrics, std::regex(R"(\ndrun_rdzv_http_bad_requests_total 3\n)")));
  RunResult bad = run({.argv = {(buildDir() / "bin" / "drun-rendezvous").string(), "--port", "0", "--http", "x:y"},
                       .timeout = 10s});
  CHECK(bad.status() == 2);  // a usage error
  CHECK(bad.err.find("--http") != std::string::npos);
}

// The agent's own health check (TORCHELASTIC_HEALTH_CHECK_PORT): the state, round and restarts of a
// job whose rank 1 failed once, while it runs; gone once drun exits; a port in use refused.
TEST_CASE("TORCHELASTIC_HEALTH_CHECK_PORT: GET /healthz answers the agent's state while it runs", "[observe]") {
  MarkerScope marker;
  TempDir dir;
  const std::string go = (dir.path() / "go").string();
  std::vector<std::string> args = {"--nproc-per-node", "2", "--max-restarts", "2"};
  for (const std::string& a : failOnceThenWait(1, 7, go)) args.push_back(a);
  auto job = std::make_unique<Process>(drunCommand(args, {marker.env(), "TORCHELASTIC_HEALTH_CHECK_PORT=0"}, 90s));
  uint16_t port = 0;
  REQUIRE(job->waitForOutput([&](const std::string&, const std::string& err) {
    std::smatch m;
    if (std::regex_search(err, m, std::regex(R"(drun: health check: GET http://\S+:(\d+)/healthz)")))
      port = static_cast<uint16_t>(std::stoi(m[1]));
    return port != 0;
  }, 30s));
  json health;
  const bool restarted = eventually([&] {
    health = json::parse(bodyOf(httpGet(port, "/healthz")), nullptr, false);
    return !health.is_discarded() && health["state"] == "Running" && health["restarts_used"] == 1 &&
           health["workers_running"] == 2;  // both wait for `go` after the restart
  }, 30s);
  INFO(health.dump());
  REQUIRE(restarted);
  CHECK(health["round"].get<int>() >= 1);
  CHECK(health["world_size"] == 2);
  CHECK(health["max_restarts"] == 2);
  CHECK(health["hostname"] == hostName());
  const std::string response = httpGet(port, "/healthz");
  CHECK(response.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(contains(response, "Content-Type: application/json"));
  CHECK(httpGet(port, "/metrics").rfind("HTTP/1.1 404", 0) == 0);

  { std::ofstream(go).put('\n'); }
  auto ended = job->wait();
  INFO(ended.describe());
  CHECK(ended.status() == 0);
  CHECK(httpGet(port, "/healthz").empty());  // nothing listens once drun exited

  // A port in use: a clear error naming it, before any worker starts.
  int taken = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  REQUIRE(::bind(taken, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(taken, 1) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(taken, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const std::string busy = std::to_string(ntohs(addr.sin_port));
  auto refused = run(drunCommand({"/bin/echo", "never"}, {marker.env(), "TORCHELASTIC_HEALTH_CHECK_PORT=" + busy}));
  ::close(taken);
  INFO(refused.describe());
  CHECK(refused.status() == 1);
  CHECK(contains(refused.err, "drun: error: TORCHELASTIC_HEALTH_CHECK_PORT (the agent's health check): cannot "
                              "listen on 0.0.0.0:" + busy + ": Address already in use"));
  CHECK_FALSE(contains(refused.out, "never"));
}

TEST_CASE("drun-rendezvous --http: promtool check metrics passes while a job restarts", "[observe]") {
  if (!hasCommand("promtool")) skipTest("promtool is not installed (Debian package prometheus)");
  MarkerScope marker;
  TempDir dir;
  Daemon daemon;
  auto job = failedOnceJob(daemon, marker, "obs6", (dir / "go").string());
  const auto file = dir.write("metrics.txt", bodyOf(httpGet(daemon.httpPort, "/metrics")));
  RunResult checked = run({.argv = {"/bin/sh", "-c", "promtool check metrics < \"$0\"", file.string()}, .timeout = 30s});
  INFO(checked.describe());
  CHECK(checked.status() == 0);
  CHECK(checked.out + checked.err == "");  // no lint warnings either
  std::ofstream(dir / "go").put('\n');
  CHECK(job->wait().status() == 0);
}

TEST_CASE("drun-rendezvous --http: /healthz answers while serving, /api/jobs/ID refuses unknown and bad ids", "[observe]") {
  Daemon daemon;
  const std::string health = httpGet(daemon.httpPort, "/healthz");
  INFO(health);
  REQUIRE(health.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(health.find("Content-Type: application/json") != std::string::npos);
  json h = json::parse(bodyOf(health), nullptr, false);
  REQUIRE(h.is_object());
  CHECK(h["status"] == "ok");
  CHECK(h["uptime_seconds"].get<double>() >= 0);
  CHECK(h["jobs"] == 0);
  CHECK(h["connections"].is_number_unsigned());
  for (const std::string& target : std::vector<std::string>{"/api/jobs/nosuchjob", "/api/jobs/", "/api/jobs/a%2Fb", "/api/jobs/..",
                                   "/api/jobs/" + std::string(200, 'x')}) {
    const std::string response = httpGet(daemon.httpPort, target);
    INFO(target << " -> " << response);
    CHECK(response.rfind("HTTP/1.1 404", 0) == 0);
    CHECK(response.find("Content-Type: application/json") != std::string::npos);
    json error = json::parse(bodyOf(response), nullptr, false);
    CHECK((error.is_object() && error["error"].is_string()));
  }
  CHECK(bodyOf(httpGet(daemon.httpPort, "/api/jobs/nosuchjob")).find("no job nosuchjob") != std::string::npos);
}

TEST_CASE("drun-rendezvous --http: namespace hosts: a lost node counts in /metrics, the next round under cause node_lost", "[observe][multinode]") {
  if (auto why = NetnsCluster::unavailableReason()) skipTest("multi-node test: " + *why);
  NetnsCluster cluster(3);
  MarkerScope marker;
  TempDir dir;
  Process daemon(RunOptions{.argv = cluster.exec(0, {(buildDir() / "bin" / "drun-rendezvous").string(), "--port",
                                                     "29534", "--http", "127.0.0.1:29535"}),
                            .timeout = 120s});
  REQUIRE(daemon.waitForOutput([](const std::string& o, const std::string&) { return portAfter(o, "http on") != 0; }, 10s));
  const std::string endpoint = cluster.address(0) + ":29534";
  auto node = [&](int host) {
    return startNamespaceNode(cluster, host, dir.path(), endpoint, "obs7", "2", "replace_timeout=60", marker);
  };
  auto metrics = [&] {
    return run({.argv = cluster.exec(0, {"/usr/bin/python3", "-c",
                                         "import urllib.request; print(urllib.request.urlopen("
                                         "'http://127.0.0.1:29535/metrics', timeout=5).read().decode())"}),
                .timeout = 20s}).out;
  };
  auto a = node(0);
  auto b = node(1);
  REQUIRE(eventually([&] {
    return fileHas(dir / "events0", "\"worker_started\"") && fileHas(dir / "events1", "\"worker_started\"");
  }, 30s));
  b->signal(SIGKILL);  // node 1 is lost; node 2 takes its place
  b->wait();
  auto c = node(2);
  REQUIRE(eventually([&] { return fileHas(dir / "events2", "\"worker_started\""); }, 30s));
  std::string text;
  const bool counted = eventually([&] {
    text = metrics();
    return text.find("drun_rdzv_job_round_restarts_total{rdzv_id=\"obs7\",cause=\"node_lost\"} 1\n") != std::string::npos;
  }, 10s);
  INFO(text);
  CHECK(counted);
  CHECK(text.find("drun_rdzv_job_lost_nodes_total{rdzv_id=\"obs7\"} 1\n") != std::string::npos);
  CHECK(text.find("drun_rdzv_job_round_restarts_total{rdzv_id=\"obs7\",cause=\"failure\"} 0\n") != std::string::npos);
  CHECK(text.find("drun_rdzv_job_nodes{rdzv_id=\"obs7\"} 2\n") != std::string::npos);
  CHECK(text.find("drun_rdzv_job_state{rdzv_id=\"obs7\",state=\"running\"} 1\n") != std::string::npos);
  std::ofstream(dir / "go").put('\n');
  CHECK(a->wait().status() == 0);
  CHECK(c->wait().status() == 0);
  daemon.signal(SIGTERM);
  CHECK(daemon.wait().status() == 0);
}

// Watching a job (issue 20, README "Watching a job"): drun's event lines (--events), the job's
// history in the store seen alike from every node, `drun status`, and drun-rendezvous --http
// (/metrics parsed by prometheus_client's parser, the page loaded in headless chromium).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "drun/common/test_skip.hpp"
#include "netns.hpp"
#include "process.hpp"

using namespace drun::test;
using nlohmann::json;

namespace {

std::vector<json> readEvents(const std::filesystem::path& path) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));  // a bad line fails the test here
  return out;
}

std::vector<json> ofKind(const std::vector<json>& events, const std::string& kind) {
  std::vector<json> out;
  for (const json& e : events)
    if (e["event"] == kind) out.push_back(e);
  return out;
}

// The fields every event carries.
void checkCommon(const json& e, const std::string& runId) {
  INFO(e.dump());
  CHECK(e["v"] == 1);
  CHECK(e["event"].is_string());
  CHECK(std::regex_match(e["ts"].get<std::string>(),
                         std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)")));
  CHECK(e["ts_ms"].is_number_integer());
  CHECK(e["run_id"] == runId);
  CHECK(!e["node"].get<std::string>().empty());
}

bool fileHas(const std::filesystem::path& path, const std::string& needle) {
  std::ifstream in(path);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return all.find(needle) != std::string::npos;
}

// Polls a condition on files the job writes (no other way to learn of it), up to `timeout`.
bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (condition()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return condition();
}

// One HTTP/1.1 GET on loopback, the whole response (status line, headers, body); "" when the
// connection failed. Each socket call has a 5 s deadline.
std::string httpGet(uint16_t port, const std::string& target, const std::string& extraHeaders = "") {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    std::string request = target.rfind("RAW:", 0) == 0
                              ? target.substr(4)
                              : "GET " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
                                    extraHeaders + "\r\n";
    (void)!::write(fd, request.data(), request.size());
    char buf[65536];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) response.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return response;
}

std::string bodyOf(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

uint16_t portAfter(const std::string& text, const std::string& marker) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(marker + R"([^\n]*:(\d+)\n)"))) return 0;
  return static_cast<uint16_t>(std::stoi(m[1]));
}

// drun-rendezvous --port 0 --http 0 (+ args); its store and HTTP ports from its first lines.
struct Daemon {
  std::unique_ptr<Process> process;
  uint16_t storePort = 0, httpPort = 0;
  explicit Daemon(const std::vector<std::string>& args = {}) {
    std::vector<std::string> argv = {(buildDir() / "bin" / "drun-rendezvous").string(), "--port", "0",
                                     "--http", "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    process = std::make_unique<Process>(RunOptions{.argv = argv, .timeout = 120s});
    std::string out;
    REQUIRE(process->waitForOutput([&](const std::string& o, const std::string&) {
      out = o;
      return portAfter(o, "http on") != 0;
    }, 10s));
    storePort = portAfter(out, "listening on");
    httpPort = portAfter(out, "http on");
  }
  ~Daemon() { process->signal(SIGTERM); }
};

// A script for the workers: rank FAILRANK exits FAILCODE in the first attempt; in later attempts
// every worker waits for the file GO (the test looks at the running job meanwhile), then exits 0.
std::vector<std::string> failOnceThenWait(int failRank, int failCode, const std::string& goFile) {
  return {"/bin/sh", "-c",
          "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then [ $RANK = " + std::to_string(failRank) +
              " ] && { echo boom >&2; exit " + std::to_string(failCode) + "; }; exit 0; fi; "
              "while [ ! -e " + goFile + " ]; do sleep 0.05; done"};
}

}  // namespace

TEST_CASE("events: a single-node job writes one line per thing that happened, field by field", "[observe]") {
  MarkerScope marker;
  TempDir dir;
  const auto file = dir / "events.jsonl";
  RunResult r = run({.argv = {drunPath().string(), "--nnodes", "1", "--rdzv-endpoint",
                              "127.0.0.1:" + std::to_string(freeLoopbackPort()), "--rdzv-id", "obs1",
                              "--max-restarts", "1", "--nproc-per-node", "2", "--events", file.string(),
                              "/bin/sh", "-c",
                              "[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && [ $RANK = 1 ] && exit 3; exit 0"},
                     .env = {marker.env()}});
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  const auto events = readEvents(file);
  for (const json& e : events) checkCommon(e, "obs1");
  REQUIRE(events.front()["event"] == "node_joining");
  CHECK(events.front()["round"].is_null());

  const auto formed = ofKind(events, "round_formed");
  REQUIRE(formed.size() == 2);
  for (int i = 0; i < 2; ++i) {
    INFO(formed[i].dump());
    CHECK(formed[i]["round"] == i);
    CHECK(formed[i]["node_rank"] == 0);
    CHECK(formed[i]["node_count"] == 1);
    CHECK(formed[i]["world_size"] == 2);
    CHECK(formed[i]["ranks"] == json::array({0, 1}));
    CHECK(formed[i]["master_addr"] == "127.0.0.1");
    CHECK(formed[i]["master_port"].get<int>() > 0);
    CHECK(formed[i]["restart_count"] == i);
    CHECK(formed[i]["max_restarts"] == 1);
    CHECK(formed[i]["hosts"].size() == 1);
  }
  const auto started = ofKind(events, "worker_started");
  REQUIRE(started.size() == 4);
  CHECK(started[1]["rank"] == 1);
  CHECK(started[1]["local_rank"] == 1);
  CHECK(started[1]["pid"].get<int>() > 0);
  const auto exited = ofKind(events, "worker_exited");
  REQUIRE(exited.size() == 4);
  bool sawFailure = false;
  for (const json& e : exited) {
    INFO(e.dump());
    if (e["round"] == 0 && e["rank"] == 1) {
      sawFailure = true;
      CHECK(e["code"] == 3);
      CHECK(e["signal"].is_null());
      CHECK(e["after_stop"] == false);
    } else if (e["after_stop"] == true) {  // rank 0, ended after drun began stopping for rank 1
      CHECK(e["round"] == 0);
      const bool exited = e["code"] == 0 && e["signal"].is_null();
      const bool stopped = e["code"].is_null() && e["signal"] == SIGTERM && e["signal_name"] == "SIGTERM";
      CHECK((exited || stopped));
    } else {
      CHECK(e["code"] == 0);
      CHECK(e["signal"].is_null());
    }
  }
  CHECK(sawFailure);
  const auto failures = ofKind(events, "failure_recorded");
  REQUIRE(failures.size() == 1);
  const json& f = failures[0]["failure"];
  CHECK(failures[0]["round"] == 0);
  CHECK(f["rank"] == 1);
  CHECK(f["local_rank"] == 1);
  CHECK(f["exit_code"] == 3);
  CHECK(f["signal"].is_null());
  CHECK(f["status"] == "exit code 3");
  CHECK(f["final"] == false);
  CHECK(f["pid"] == started[1]["pid"]);
  const auto restarts = ofKind(events, "restart");
  REQUIRE(restarts.size() == 1);
  CHECK(restarts[0]["count"] == 1);
  CHECK(restarts[0]["max_restarts"] == 1);
  CHECK(restarts[0]["budget_left"] == 0);
  CHECK(events.back()["event"] == "job_succeeded");
  CHECK(events.back()["code"] == 0);
  CHECK(ofKind(events, "job_failed").empty());
}

TEST_CASE("events: a hung rank and a job that fails for good, DRUN_EVENTS=- writes to stderr", "[observe]") {
  MarkerScope marker;
  RunResult r = run({.argv = {drunPath().string(), "--nnodes", "1", "--rdzv-endpoint",
                              "127.0.0.1:" + std::to_string(freeLoopbackPort()), "--rdzv-id", "obs2",
                              "--nproc-per-node", "2", "--hang-idle", "1", "/bin/sh", "-c",
                              "[ $RANK = 1 ] && exec sleep 1000; exit 0"},
                     .env = {marker.env(), "DRUN_EVENTS=-"},
                     .timeout = 60s});
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() != 0);
  std::vector<json> events;
  for (const std::string& line : splitLines(r.err))
    if (!line.empty() && line[0] == '{') events.push_back(json::parse(line));
  for (const json& e : events) checkCommon(e, "obs2");
  const auto hangs = ofKind(events, "hang_detected");
  REQUIRE(hangs.size() == 1);
  CHECK(hangs[0]["rank"] == 1);
  CHECK(hangs[0]["local_rank"] == 1);
  CHECK(hangs[0]["round"] == 0);
  CHECK(hangs[0]["rule"] == "idle");
  CHECK(hangs[0]["section"] == "");
  CHECK(hangs[0]["what"].get<std::string>().find("no CPU time") != std::string::npos);
  CHECK(!hangs[0]["stack_how"].get<std::string>().empty());
  const auto failures = ofKind(events, "failure_recorded");
  REQUIRE(failures.size() == 1);
  CHECK(failures[0]["failure"]["rank"] == 1);
  CHECK(failures[0]["failure"]["final"] == true);
  CHECK(ofKind(events, "restart").empty());
  REQUIRE(!events.empty());
  CHECK(events.back()["event"] == "job_failed");
  CHECK(events.back()["code"] == r.status());
  CHECK(events.back()["root_cause"]["rank"] == 1);
}

TEST_CASE("events: namespace hosts: a node waiting, a node taken in, one history in the store on every node, drun status", "[observe][multinode]") {
  if (auto why = NetnsCluster::unavailableReason()) skipTest("multi-node test: " + *why);
  NetnsCluster cluster(2);
  MarkerScope marker;
  TempDir dir;
  const std::string go = (dir / "go").string();
  const std::string endpoint = cluster.address(0) + ":29531";
  auto node = [&](int host) {
    return std::make_unique<Process>(RunOptions{
        .argv = cluster.exec(host, {drunPath().string(), "--nnodes", "1:2", "--rdzv-endpoint", endpoint,
                                    "--rdzv-id", "obs3", "--rdzv-conf", "last_call_timeout=1",
                                    "--local-addr", cluster.address(host), "--events",
                                    (dir / ("events" + std::to_string(host))).string(), "/bin/sh", "-c",
                                    "while [ ! -e " + go + " ]; do sleep 0.05; done"}),
        .env = {marker.env()},
        .timeout = 90s});
  };
  auto a = node(0);
  REQUIRE(eventually([&] { return fileHas(dir / "events0", "\"worker_started\""); }, 20s));
  auto b = node(1);
  REQUIRE(eventually([&] { return fileHas(dir / "events1", "\"worker_started\""); }, 30s));
  // Both nodes run round 1; their events are in the store once the files and the history agree.
  auto status = [&](int host, std::vector<std::string> args) {
    std::vector<std::string> argv = {drunPath().string(), "status", "--rdzv-endpoint", endpoint};
    argv.insert(argv.end(), args.begin(), args.end());
    return run({.argv = cluster.exec(host, argv), .timeout = 20s});
  };
  size_t inFiles = 0;
  RunResult h0, h1;
  REQUIRE(eventually([&] {
    inFiles = readEvents(dir / "events0").size() + readEvents(dir / "events1").size();
    h0 = status(0, {"--rdzv-id", "obs3", "--history"});
    return splitLines(h0.out).size() == inFiles;
  }, 10s));
  h1 = status(1, {"--rdzv-id", "obs3", "--history"});
  INFO(h0.describe() << h1.describe());
  CHECK(h0.status() == 0);
  CHECK(h1.out == h0.out);  // one history, the same from every node
  std::multiset<std::string> fromFiles, fromStore;
  for (int host : {0, 1})
    for (json e : readEvents(dir / ("events" + std::to_string(host)))) fromFiles.insert(e.dump());
  for (const std::string& line : splitLines(h0.out)) {
    json e = json::parse(line);
    e.erase("seq");
    fromStore.insert(e.dump());
  }
  CHECK(fromStore == fromFiles);

  RunResult text = status(1, {"--rdzv-id", "obs3"});
  INFO(text.describe());
  CHECK(text.status() == 0);
  CHECK(text.out.find("job obs3: running") != std::string::npos);
  CHECK(text.out.find("round: 1, world size 2, 2 node(s)") != std::string::npos);
  CHECK(text.out.find("restarts: 0 of 0") != std::string::npos);
  CHECK(text.out.find("hung ranks: none") != std::string::npos);
  RunResult js = status(0, {"--rdzv-id", "obs3", "--json"});
  json j = json::parse(js.out);
  CHECK(j["state"] == "running");
  CHECK(j["round"] == 1);
  CHECK(j["world_size"] == 2);
  CHECK(j["nodes"].size() == 2);
  CHECK(j["waiting"].empty());
  RunResult all = status(0, {"--json"});
  json jobs = json::parse(all.out)["jobs"];
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0]["run_id"] == "obs3");
  CHECK(status(0, {}).out.find("obs3") != std::string::npos);

  std::ofstream(go).put('\n');
  RunResult ra = a->wait(), rb = b->wait();
  INFO(ra.describe() << rb.describe());
  CHECK(ra.status() == 0);
  CHECK(rb.status() == 0);
  const auto ea = readEvents(dir / "events0"), eb = readEvents(dir / "events1");
  for (const json& e : ea) checkCommon(e, "obs3");
  for (const json& e : eb) checkCommon(e, "obs3");
  const auto waiting = ofKind(ea, "node_waiting");
  REQUIRE(waiting.size() >= 1);
  CHECK(waiting[0]["round"] == 0);
  CHECK(waiting[0]["reason"].get<std::string>().find("waiting") != std::string::npos);
  const auto taken = ofKind(eb, "spare_taken_in");
  REQUIRE(taken.size() == 1);
  CHECK(taken[0]["round"] == 1);
  CHECK(ofKind(eb, "round_formed").back()["node_count"] == 2);
  CHECK(ea.back()["event"] == "job_succeeded");
  CHECK(eb.back()["event"] == "job_succeeded");
}

TEST_CASE("drun status: an endpoint with no store is a clear error in bounded time", "[observe]") {
  const std::string endpoint = "127.0.0.1:" + std::to_string(freeLoopbackPort());
  RunResult r = run({.argv = {drunPath().string(), "status", "--rdzv-endpoint", endpoint, "--timeout", "1s"},
                     .timeout = 20s});
  INFO(r.describe());
  CHECK(r.status() == 1);
  CHECK(r.err.find("drun status: error: " + endpoint) != std::string::npos);
  CHECK(r.wall < 10s);
  RunResult none = run({.argv = {drunPath().string(), "status"}, .timeout = 20s});
  CHECK(none.status() != 0);
  CHECK(none.err.find("--rdzv-endpoint") != std::string::npos);
}

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
    skipTest("python3-prometheus-client is not installed (scripts/setup.sh installs it)");
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
import sys
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
assert value("drun_rdzv_job_rounds", "drun_rdzv_job_rounds_total", job="obs4") == 2, "rounds"
assert value("drun_rdzv_job_restarts", job="obs4") == 1, "restarts"
assert fams["drun_rdzv_round_close_seconds"].type == "histogram"
assert value("drun_rdzv_round_close_seconds", "drun_rdzv_round_close_seconds_count") == 2, "closes"
assert value("drun_rdzv_round_close_seconds", "drun_rdzv_round_close_seconds_bucket", le="+Inf") == 2
assert value("drun_rdzv_connections_refused", "drun_rdzv_connections_refused_total") == 0
assert value("drun_rdzv_held_bytes") > 0
print("metrics ok")
)PY";
  RunResult parsed = run({.argv = {"/usr/bin/python3", "-c", check, (dir / "metrics.txt").string()}});
  INFO(parsed.describe());
  CHECK(parsed.out.find("metrics ok") != std::string::npos);
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
  if (chromium.empty()) skipTest("chromium is not installed (scripts/setup.sh installs it)");
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
  const auto shot = buildDir() / "tests" / "observe_page.png";
  RunResult png = browse("--screenshot=" + shot.string());
  INFO(png.describe());
  CHECK(std::filesystem::exists(shot));
  CHECK(std::filesystem::file_size(shot) > 1000);
  std::ofstream(dir / "go").put('\n');
  CHECK(job->wait().status() == 0);
}

TEST_CASE("drun-rendezvous --http: the token guards it, malformed and oversized requests get 400", "[observe]") {
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
  RunResult bad = run({.argv = {(buildDir() / "bin" / "drun-rendezvous").string(), "--port", "0", "--http", "x:y"},
                       .timeout = 10s});
  CHECK(bad.status() == 1);
  CHECK(bad.err.find("--http") != std::string::npos);
}

TEST_CASE("events: namespace hosts: a lost node and its replacement", "[observe][multinode]") {
  if (auto why = NetnsCluster::unavailableReason()) skipTest("multi-node test: " + *why);
  NetnsCluster cluster(3);
  MarkerScope marker;
  TempDir dir;
  const std::string go = (dir / "go").string();
  const std::string endpoint = cluster.address(0) + ":29532";
  auto node = [&](int host) {
    return std::make_unique<Process>(RunOptions{
        .argv = cluster.exec(host, {drunPath().string(), "--nnodes", "2", "--rdzv-endpoint", endpoint,
                                    "--rdzv-id", "obs6", "--rdzv-conf", "replace_timeout=60",
                                    "--local-addr", cluster.address(host), "--events",
                                    (dir / ("events" + std::to_string(host))).string(), "/bin/sh", "-c",
                                    "while [ ! -e " + go + " ]; do sleep 0.05; done"}),
        .env = {marker.env()},
        .timeout = 90s});
  };
  auto a = node(0);
  auto b = node(1);
  REQUIRE(eventually([&] {
    return fileHas(dir / "events0", "\"worker_started\"") && fileHas(dir / "events1", "\"worker_started\"");
  }, 30s));
  b->signal(SIGKILL);  // node 1 is lost; node 0 waits for a replacement (fewer than --nnodes 2)
  b->wait();
  REQUIRE(eventually([&] { return fileHas(dir / "events0", "\"node_lost\""); }, 20s));
  auto c = node(2);
  REQUIRE(eventually([&] { return fileHas(dir / "events2", "\"worker_started\""); }, 30s));
  std::ofstream(go).put('\n');
  RunResult ra = a->wait(), rc = c->wait();
  INFO(ra.describe() << rc.describe());
  CHECK(ra.status() == 0);
  CHECK(rc.status() == 0);
  const auto ea = readEvents(dir / "events0"), ec = readEvents(dir / "events2");
  for (const json& e : ea) checkCommon(e, "obs6");
  for (const json& e : ec) checkCommon(e, "obs6");
  const auto lost = ofKind(ea, "node_lost");
  REQUIRE(lost.size() == 1);
  CHECK(lost[0]["round"] == 0);
  CHECK(lost[0]["reason"].get<std::string>().find(cluster.address(1)) != std::string::npos);
  const auto formed = ofKind(ea, "round_formed");
  REQUIRE(formed.size() == 2);
  CHECK(formed[1]["node_rank"] == 0);
  CHECK(formed[1]["restart_count"] == 0);  // a membership change spends no restart
  const auto replaced = ofKind(ea, "replacement");
  REQUIRE(replaced.size() == 1);
  CHECK(replaced[0]["round"] == formed[1]["round"]);
  REQUIRE(replaced[0]["new"].size() == 1);
  CHECK(replaced[0]["new"][0].get<std::string>().find(cluster.address(2)) != std::string::npos);
  REQUIRE(replaced[0]["lost"].size() == 1);
  CHECK(replaced[0]["lost"][0].get<std::string>().find(cluster.address(1)) != std::string::npos);
  const auto taken = ofKind(ec, "spare_taken_in");
  REQUIRE(taken.size() == 1);
  CHECK(taken[0]["round"] == formed[1]["round"]);
  CHECK(ea.back()["event"] == "job_succeeded");
  CHECK(ec.back()["event"] == "job_succeeded");
}

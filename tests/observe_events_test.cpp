// Watching a job (docs/observe.md): drun's event lines (--events, DRUN_EVENTS)
// field by field on one node and on namespace hosts, the job's history in the store seen alike
// from every node, and `drun status`.
#include "observe_support.hpp"

using namespace drun::test;
using namespace drun::test::observe;

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

TEST_CASE("events: a hung rank and a job that fails for good, DRUN_EVENTS=- writes to stdout (nothing "
          "else there: the workers' stdout in their log files)", "[observe]") {
  MarkerScope marker;
  TempDir logs;
  RunResult r = run({.argv = {drunPath().string(), "--nnodes", "1", "--rdzv-endpoint",
                              "127.0.0.1:" + std::to_string(freeLoopbackPort()), "--rdzv-id", "obs2",
                              "--nproc-per-node", "2", "--hang-idle", "1", "--redirects", "1",
                              "--log-dir", logs.path().string(), "/bin/sh", "-c",
                              "echo not an event; [ $RANK = 1 ] && exec sleep 1000; exit 0"},
                     .env = {marker.env(), "DRUN_EVENTS=-"},
                     .timeout = 60s});
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() != 0);
  std::vector<json> events;
  for (const std::string& line : splitLines(r.out)) {
    if (line.empty()) continue;
    events.push_back(json::parse(line, nullptr, false));
    CHECK_FALSE(events.back().is_discarded());  // every line on stdout is an event
  }
  CHECK_FALSE(contains(r.err, "{\"v\":1"));
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
  CHECK(hangs[0]["why"].get<std::string>().rfind("rank 1 is not waiting for its peers", 0) == 0);
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

TEST_CASE("events: --events - and DRUN_EVENTS=- are refused while workers write to stdout, naming "
          "--events FILE", "[observe]") {
  for (const bool fromEnv : {false, true}) {
    std::vector<std::string> argv = {drunPath().string(), "--nproc-per-node", "2"};
    if (!fromEnv) argv.insert(argv.end(), {"--events", "-"});
    // Rank 1's stdout on the console; both teed; no routing at all.
    for (const std::vector<std::string>& routing :
         std::vector<std::vector<std::string>>{{}, {"--redirects", "0:1,1:0"}, {"--redirects", "1", "--tee", "1"}}) {
      std::vector<std::string> withRouting = argv;
      withRouting.insert(withRouting.end(), routing.begin(), routing.end());
      withRouting.push_back("/bin/true");
      RunResult r = run({.argv = withRouting, .env = {fromEnv ? "DRUN_EVENTS=-" : "DRUN_EVENTS="},
                         .timeout = 20s});
      INFO(r.describe());
      CHECK(r.status() == 2);
      CHECK(contains(r.err, "drun: error: --events - (or DRUN_EVENTS=-) writes the events to stdout"));
      CHECK(contains(r.err, "--events FILE"));
    }
  }
}

TEST_CASE("events: two nodes, a rank of one fails once: both nodes' events have the root cause and "
          "the restart", "[observe]") {
  Daemon daemon;
  MarkerScope marker;
  TempDir dir;
  const std::string go = (dir / "go").string();
  auto node = [&](int i) {
    std::vector<std::string> argv = {drunPath().string(), "--nnodes", "2", "--rdzv-endpoint",
                                     "127.0.0.1:" + std::to_string(daemon.storePort), "--rdzv-id", "obs7",
                                     "--max-restarts", "1", "--events",
                                     (dir / ("events" + std::to_string(i))).string()};
    for (const auto& a : failOnceThenWait(1, 7, go)) argv.push_back(a);
    return std::make_unique<Process>(RunOptions{.argv = argv, .env = {marker.env()}, .timeout = 90s});
  };
  auto a = node(0);
  auto b = node(1);
  REQUIRE(eventually([&] {
    return ofKind(readEvents(dir / "events0"), "round_formed").size() == 2 &&
           ofKind(readEvents(dir / "events1"), "round_formed").size() == 2;
  }, 60s));
  std::ofstream(go).put('\n');
  RunResult ra = a->wait(), rb = b->wait();
  INFO(ra.describe() << rb.describe());
  CHECK(ra.status() == 0);
  CHECK(rb.status() == 0);
  for (const auto& events : {readEvents(dir / "events0"), readEvents(dir / "events1")}) {
    const auto failures = ofKind(events, "failure_recorded");
    REQUIRE(failures.size() == 1);
    CHECK(failures[0]["round"] == 0);
    CHECK(failures[0]["failure"]["rank"] == 1);
    CHECK(failures[0]["failure"]["exit_code"] == 7);
    const auto restarts = ofKind(events, "restart");
    REQUIRE(restarts.size() == 1);
    CHECK(restarts[0]["round"] == 0);
    CHECK(restarts[0]["count"] == 1);
    CHECK(restarts[0]["budget_left"] == 0);
  }
}

TEST_CASE("events: namespace hosts: a node waiting, a node taken in, one history in the store on every node, drun status", "[observe][multinode]") {
  if (auto why = NetnsCluster::unavailableReason()) skipTest("multi-node test: " + *why);
  NetnsCluster cluster(2);
  MarkerScope marker;
  TempDir dir;
  const std::string go = (dir / "go").string();
  const std::string endpoint = cluster.address(0) + ":29531";
  auto node = [&](int host) {
    return startNamespaceNode(cluster, host, dir.path(), endpoint, "obs3", "1:2", "last_call_timeout=1", marker);
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

TEST_CASE("drun status: an endpoint with no store is a clear error in bounded time, --events unwritable a usage error", "[observe]") {
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
  // An --events file that cannot be opened is a usage error before anything starts.
  RunResult events = run({.argv = {drunPath().string(), "--events", "/nonexistent/dir/e.jsonl", "/bin/true"},
                          .timeout = 20s});
  CHECK(events.status() == 2);
  CHECK(events.err.find("--events /nonexistent/dir/e.jsonl: cannot open it") != std::string::npos);
}

TEST_CASE("events: namespace hosts: a lost node and its replacement", "[observe][multinode]") {
  if (auto why = NetnsCluster::unavailableReason()) skipTest("multi-node test: " + *why);
  NetnsCluster cluster(3);
  MarkerScope marker;
  TempDir dir;
  const std::string go = (dir / "go").string();
  const std::string endpoint = cluster.address(0) + ":29532";
  auto node = [&](int host) {
    return startNamespaceNode(cluster, host, dir.path(), endpoint, "obs6", "2", "replace_timeout=60", marker);
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

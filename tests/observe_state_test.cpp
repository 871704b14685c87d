// Watching a job (docs/observe.md): drun-rendezvous --state-dir keeps the jobs' history across
// restarts, so that a daemon SIGKILLed and started again with the same dir still tells how an
// ended job ended.
#include <signal.h>

#include "observe_support.hpp"

using namespace drun::test;
using namespace drun::test::observe;

TEST_CASE("drun-rendezvous --state-dir: a daemon SIGKILLed and started again still tells how a job ended", "[observe]") {
  MarkerScope marker;
  TempDir dir;
  const std::filesystem::path stateDir = dir / "state";
  const std::vector<std::string> daemonArgs = {"--state-dir", stateDir.string()};
  auto daemon = std::make_unique<Daemon>(daemonArgs);
  // Rank 1 exits 7 and the job has no restart left: it fails for good.
  RunResult job = run({.argv = {drunPath().string(), "--nnodes", "1", "--rdzv-endpoint",
                                "127.0.0.1:" + std::to_string(daemon->storePort), "--rdzv-id", "kept1",
                                "--max-restarts", "0", "--nproc-per-node", "2", "/bin/sh", "-c",
                                "[ $RANK = 1 ] && exit 7; exit 0"},
                       .env = {marker.env()},
                       .timeout = 60s});
  INFO(job.describe());
  REQUIRE(!job.timedOut);
  REQUIRE(job.status() != 0);
  // Written within about a second of the job's end (the daemon batches its writes).
  const std::filesystem::path file = stateDir / "state.json";
  REQUIRE(eventually([&] {
    std::ifstream in(file);
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    return text.find("\"kept1\"") != std::string::npos && text.find("\"outcome\"") != std::string::npos;
  }, 10s));

  daemon->process->signal(SIGKILL);
  daemon->process->wait(10s);
  daemon.reset();
  Daemon again(daemonArgs);
  RunResult status = run({.argv = {drunPath().string(), "status", "--rdzv-endpoint",
                                   "127.0.0.1:" + std::to_string(again.storePort), "--rdzv-id", "kept1"},
                          .timeout = 20s});
  INFO(status.describe());
  CHECK(status.status() == 0);
  CHECK(status.out.find("job kept1: failed") != std::string::npos);
  CHECK(status.out.find("exit code 7") != std::string::npos);
  // The page's data too: the restored history reached the monitor.
  json jobs = json::parse(bodyOf(httpGet(again.httpPort, "/api/jobs")), nullptr, false);
  REQUIRE(jobs.is_object());
  REQUIRE(jobs["jobs"].size() == 1);
  CHECK(jobs["jobs"][0]["run_id"] == "kept1");
  CHECK(jobs["jobs"][0]["state"] == "failed");
  for (const auto& entry : std::filesystem::directory_iterator(stateDir))
    CHECK(entry.path().filename().string().find(".bad-") == std::string::npos);
}

TEST_CASE("drun-rendezvous --state-dir: a corrupt state.json is named, moved aside, and the daemon serves empty", "[observe]") {
  TempDir dir;
  const std::filesystem::path stateDir = dir / "state";
  std::filesystem::create_directories(stateDir);
  std::ofstream(stateDir / "state.json") << R"({"version":1,"jobs":{"x":{"events/next":"1")";
  Daemon daemon({"--state-dir", stateDir.string()});
  CHECK(daemon.process->waitForOutput([](const std::string&, const std::string& err) {
    return err.find("state.json cannot be used (not JSON") != std::string::npos &&
           err.find("moved aside to") != std::string::npos;
  }, 10s));
  CHECK_FALSE(std::filesystem::exists(stateDir / "state.json"));
  json jobs = json::parse(bodyOf(httpGet(daemon.httpPort, "/api/jobs")), nullptr, false);
  REQUIRE(jobs.is_object());
  CHECK(jobs["jobs"].empty());
  // A --state-dir that cannot be a directory (below a file) is a usage error naming it.
  std::ofstream(dir / "plain") << "x";
  RunResult bad = run({.argv = {(buildDir() / "bin" / "drun-rendezvous").string(), "--port", "0",
                                "--state-dir", (dir / "plain" / "x").string(),
                                "--max-state-bytes", "1K"},
                       .timeout = 20s});
  INFO(bad.describe());
  CHECK(bad.status() == 2);
  CHECK(bad.err.find("--state-dir") != std::string::npos);
}

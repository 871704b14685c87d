// End-to-end tests of drun's and drun-rendezvous' own logs and the workers' log files: --log-format
// json (one object per line, on both), --log-max-bytes/--log-max-files rotation under --log-dir,
// their bad values as usage errors (exit 2 naming the option), and drun trace's edges (--version,
// usage errors exit 2).
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "process.hpp"

namespace drun::test::cli_logs {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

const std::string kDaemon = "drun-rendezvous";

RunResult daemonRun(std::vector<std::string> args, std::vector<std::string> env = {}) {
  args.insert(args.begin(), (buildDir() / "bin" / kDaemon).string());
  return run({.argv = args, .env = env, .timeout = 20s});
}

// One JSON log line: the fields in this order, the time RFC 3339 UTC with milliseconds.
std::regex jsonLine(const std::string& component) {
  return std::regex(R"(^\{"time":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z","level":"[a-z]+","component":")" +
                    component + R"(","message":".*\}$)");
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

std::string readAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The one file called `name` under `dir` (the --log-dir tree's run, node and attempt levels).
fs::path findFile(const fs::path& dir, const std::string& name) {
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.path().filename() == name) return entry.path();
  return {};
}

}  // namespace

TEST_CASE("cli logs: --log-format json makes drun's own lines JSON objects, the node's rank on them once known",
          "[e2e]") {
  RunResult r = run(drunCommand({"--log-format", "json", "/bin/true"}, {"DRUN_LOG_LEVEL=debug"}));
  INFO(r.describe());
  CHECK(r.status() == 0);
  const std::vector<std::string> err = lines(r.err);
  REQUIRE(err.size() > 2);
  const std::regex json = jsonLine("drun");
  bool withNode = false;
  for (const std::string& line : err) {
    INFO(line);
    CHECK(std::regex_match(line, json));
    withNode = withNode || contains(line, R"(,"node":"0"})");
  }
  CHECK(withNode);
  CHECK(contains(r.err, R"("level":"debug")"));

  // The agent's own console lines (where the log files go, a failed worker's summary) alike.
  TempDir logs;
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--log-format", "json", "--log-dir", logs.path().string(), "-r", "3", "/bin/true"},
           {"--log-format", "json", "/bin/false"}}) {
    RunResult agentLines = run(drunCommand(args));
    INFO(agentLines.describe());
    REQUIRE_FALSE(lines(agentLines.err).empty());
    for (const std::string& line : lines(agentLines.err)) {
      INFO(line);
      CHECK(std::regex_match(line, json));
    }
  }

  // The same from the environment; text (today's lines) stays the default.
  RunResult fromEnv = run(drunCommand({"/bin/true"}, {"DRUN_LOG_LEVEL=debug", "DRUN_LOG_FORMAT=json"}));
  INFO(fromEnv.describe());
  CHECK(std::regex_match(lines(fromEnv.err).front(), json));
  RunResult text = run(drunCommand({"/bin/true"}, {"DRUN_LOG_LEVEL=debug"}));
  CHECK(std::regex_search(text.err, std::regex(R"((^|\n)drun: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z debug: )")));
}

TEST_CASE("cli logs: under --log-format json the join's progress lines are JSON too, the last error stays text",
          "[e2e]") {
  const std::string endpoint = "127.0.0.1:" + std::to_string(freeLoopbackPort());
  RunResult r = run(drunCommand({"--log-format", "json", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                 endpoint, "--rdzv-id", "json-progress", "--rdzv-conf", "join_timeout=3",
                                 "/bin/true"}));
  INFO(r.describe());
  CHECK(r.status() == 1);  // nobody else joined
  const std::regex json = jsonLine("drun");
  int progress = 0;
  for (const std::string& line : lines(r.err)) {
    INFO(line);
    if (line.rfind("drun: error: ", 0) == 0) continue;
    CHECK(std::regex_match(line, json));
    progress += contains(line, R"("level":"info")") && contains(line, "waiting");
  }
  CHECK(progress >= 1);
}

TEST_CASE("cli logs: drun-rendezvous --log-format json", "[e2e]") {
  Process daemon(RunOptions{.argv = {(buildDir() / "bin" / kDaemon).string(), "--host", "127.0.0.1", "--port",
                                     "0", "--log-format", "json", "--log-level", "info"},
                            .timeout = 60s});
  std::string err;
  const bool warned = daemon.waitForOutput([&](const std::string&, const std::string& e) {
    err = e;
    return contains(e, "open to anyone") && e.back() == '\n';
  }, 10s);
  INFO(err);
  REQUIRE(warned);
  const std::regex json = jsonLine(kDaemon);
  for (const std::string& line : lines(err)) {
    INFO(line);
    CHECK(std::regex_match(line, json));
  }
  CHECK(contains(err, R"("level":"warning")"));
  CHECK(contains(err, R"("level":"info")"));
}

TEST_CASE("cli logs: a bad --log-format, DRUN_LOG_FORMAT, --log-max-bytes or --log-max-files exits 2 naming it",
          "[e2e]") {
  const std::vector<std::pair<RunResult, std::string>> cases = {
      {run(drunCommand({"--log-format", "xml", "/bin/true"})),
       "drun: error: --log-format: expected text or json, got 'xml'"},
      {run(drunCommand({"/bin/true"}, {"DRUN_LOG_FORMAT=xml"})), "drun: error: DRUN_LOG_FORMAT: expected text or json"},
      {run(drunCommand({"status", "--rdzv-endpoint", "127.0.0.1:1"}, {"DRUN_LOG_FORMAT=xml"})), "DRUN_LOG_FORMAT"},
      {daemonRun({"--port", "0", "--log-format", "xml"}), "drun-rendezvous: error: --log-format: expected text or json"},
      {daemonRun({"--port", "0"}, {"DRUN_LOG_FORMAT=yaml"}), "drun-rendezvous: error: DRUN_LOG_FORMAT"},
      {run(drunCommand({"--log-max-bytes", "12X", "/bin/true"})), "drun: error: --log-max-bytes '12X'"},
      {run(drunCommand({"--log-max-bytes", "-1", "/bin/true"})), "drun: error: --log-max-bytes '-1'"},
      {run(drunCommand({"--log-max-files", "-3", "/bin/true"})), "drun: error: --log-max-files"},
  };
  for (const auto& [r, line] : cases) {
    INFO(r.describe());
    CHECK(r.status() == 2);
    CHECK(contains(r.err, line));
  }
}

TEST_CASE("cli logs: --log-max-bytes rotates a worker's --log-dir file at that size, keeping --log-max-files "
          "files, the kept ones the output's tail",
          "[e2e]") {
  TempDir dir;
  RunResult r = run(drunCommand({"--log-dir", dir.path().string(), "--log-max-bytes", "1K", "--log-max-files", "2",
                                 "-r", "3", "/bin/sh", "-c", "seq 1 2000"}));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  std::string expected;
  for (int i = 1; i <= 2000; ++i) expected += std::to_string(i) + "\n";  // 8893 bytes
  const fs::path log = findFile(dir.path(), "stdout.log");
  REQUIRE_FALSE(log.empty());
  const std::string older = readAll(log.string() + ".2"), newer = readAll(log.string() + ".1");
  CHECK(older.size() == 1024);
  CHECK(newer.size() == 1024);
  CHECK_FALSE(fs::exists(log.string() + ".3"));
  const std::string kept = older + newer + readAll(log);
  CHECK(kept.size() == 2 * 1024 + (8893 - 8 * 1024));
  CHECK(kept == expected.substr(expected.size() - kept.size()));
  CHECK(fs::exists(log.parent_path() / "stderr.log"));
  CHECK_FALSE(fs::exists(log.parent_path() / "stderr.log.1"));  // empty: never rotated
}

TEST_CASE("cli logs: drun trace --version, and its usage errors exit 2", "[e2e]") {
  RunResult version = run(drunCommand({"trace", "--version"}));
  INFO(version.describe());
  CHECK(version.status() == 0);
  CHECK(version.out == "drun 0.1.0\n");
  RunResult help = run(drunCommand({"trace", "--help"}));
  CHECK(help.status() == 0);
  CHECK(contains(help.out, "Usage: drun trace DIR"));
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"trace"}, {"trace", "a", "b"}, {"trace", "--bogus"}, {"trace", ""}}) {
    RunResult bad = run(drunCommand(args));
    INFO(bad.describe());
    CHECK(bad.status() == 2);
    CHECK(contains(bad.err, "usage: drun trace DIR"));
  }
}

}  // namespace drun::test::cli_logs

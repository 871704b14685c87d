// End-to-end tests of the command lines' edges, as an operator meets them: every usage error of
// drun, drun status and drun-rendezvous exits 2; --version on all three; drun status' hints
// and usage line name its own options; an endpoint port 0 and a --log-dir nobody may create are
// usage errors naming the option.
#include <catch2/catch.hpp>
#include <regex>

#include "process.hpp"

namespace drun::test::cli_edges {

using namespace std::chrono_literals;

namespace {

RunResult daemonRun(std::vector<std::string> args) {
  args.insert(args.begin(), (buildDir() / "bin" / "drun-rendezvous").string());
  return run({.argv = args, .timeout = 20s});
}

RunResult statusRun(std::vector<std::string> args) {
  args.insert(args.begin(), {drunPath().string(), "status"});
  return run({.argv = args, .timeout = 20s});
}

}  // namespace

TEST_CASE("cli edges: every usage error of drun, drun status and drun-rendezvous exits 2 with an "
          "error line", "[e2e]") {
  const std::vector<std::pair<RunResult, std::string>> cases = {
      {run(drunCommand({"--bogus", "/bin/true"})), "drun: error:"},
      {statusRun({}), "drun status: error: --rdzv-endpoint is required"},
      {statusRun({"--rdzv-endpoint", "127.0.0.1:1", "--bogus"}), "drun status: error:"},
      {statusRun({"--rdzv-endpoint", "127.0.0.1:1", "--timeout", "soon"}), "drun status: error:"},
      {daemonRun({"--bogus"}), "drun-rendezvous: error:"},
      {daemonRun({"--port", "http"}), "drun-rendezvous: error:"},
      {daemonRun({"--port", "0", "--lease-timeout", "forever"}), "drun-rendezvous: error:"},
      {daemonRun({"--port", "0", "--http", "x:y"}), "drun-rendezvous: error:"},
  };
  for (const auto& [r, line] : cases) {
    INFO(r.describe());
    CHECK(r.status() == 2);
    CHECK(contains(r.err, line));
  }
}

TEST_CASE("cli edges: --version on drun, drun status and drun-rendezvous", "[e2e]") {
  const std::vector<std::pair<RunResult, std::string>> cases = {
      {run(drunCommand({"--version"})), "drun 0.1.0\n"},
      {statusRun({"--version"}), "drun 0.1.0\n"},
      {daemonRun({"--version"}), "drun-rendezvous 0.1.0\n"},
  };
  for (const auto& [r, line] : cases) {
    INFO(r.describe());
    CHECK(r.status() == 0);
    CHECK(r.out == line);
  }
}

TEST_CASE("cli edges: drun status names its own options: the usage line, and --token-file when the "
          "store asks for a token", "[e2e]") {
  RunResult help = statusRun({"--help"});
  INFO(help.describe());
  CHECK(help.status() == 0);
  const std::string usage = help.out.substr(help.out.find("Usage: "), help.out.find("Options:") - help.out.find("Usage: "));
  for (const char* option : {"--rdzv-endpoint", "--rdzv-backend", "--rdzv-conf", "--token-file",
                             "--rdzv-id", "--history", "--json", "--timeout"})
    CHECK(contains(usage, option));
  RunResult missing = statusRun({});
  CHECK(contains(missing.err, "Usage: drun status --rdzv-endpoint"));

  TempDir dir;
  const auto token = dir.write("token", "correct-token-0123456789abcdef\n");
  Process daemon(RunOptions{.argv = {(buildDir() / "bin" / "drun-rendezvous").string(), "--host",
                                     "127.0.0.1", "--port", "0", "--token-file", token.string()},
                            .timeout = 60s});
  std::string out;
  REQUIRE(daemon.waitForOutput([&](const std::string& o, const std::string&) {
    out = o;
    return contains(o, "listening on") && o.find('\n') != std::string::npos;
  }, 10s));
  const std::string endpoint = "127.0.0.1:" + out.substr(out.rfind(':') + 1, out.find('\n') - out.rfind(':') - 1);
  RunResult none = run({.argv = {drunPath().string(), "status", "--rdzv-endpoint", endpoint},
                        .env = {"DRUN_RDZV_TOKEN_FILE="},
                        .timeout = 20s});
  INFO(none.describe());
  CHECK(none.status() == 1);
  CHECK(contains(none.err, "requires a token"));
  CHECK(contains(none.err, "--token-file PATH"));
  CHECK_FALSE(contains(none.err, "--rdzv-conf token_file"));
  RunResult given = statusRun({"--rdzv-endpoint", endpoint, "--token-file", token.string()});
  INFO(given.describe());
  CHECK(given.status() == 0);
}

TEST_CASE("cli edges: --rdzv-endpoint with port 0 and a --log-dir nobody may create are usage errors "
          "naming the option", "[e2e]") {
  RunResult port0 = run(drunCommand({"--rdzv-endpoint", "127.0.0.1:0", "/bin/true"}));
  INFO(port0.describe());
  CHECK(port0.status() == 2);
  CHECK(contains(port0.err, "drun: error: --rdzv-endpoint"));
  CHECK(contains(port0.err, "port"));
  RunResult status0 = statusRun({"--rdzv-endpoint", "127.0.0.1:0"});
  INFO(status0.describe());
  CHECK(status0.status() == 2);
  CHECK(contains(status0.err, "--rdzv-endpoint"));

  // sysfs takes no directory from anyone, root included.
  RunResult logs = run(drunCommand({"--log-dir", "/sys/drun-logs-test", "/bin/true"}));
  INFO(logs.describe());
  CHECK(logs.status() == 2);
  CHECK(contains(logs.err, "drun: error: --log-dir /sys/drun-logs-test: cannot create it: "));
  // An existing directory that takes no job directory: named too, before any worker starts.
  RunResult existing = run(drunCommand({"--log-dir", "/sys", "/bin/true"}));
  INFO(existing.describe());
  CHECK(existing.status() != 0);
  CHECK(contains(existing.err, "drun: error: --log-dir /sys: cannot create "));
}

TEST_CASE("cli edges: drun's and the daemon's log lines carry the UTC time", "[e2e]") {
  const std::regex stamped(R"((^|\n)drun-rendezvous: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z warning: the store on )");
  Process daemon(RunOptions{.argv = {(buildDir() / "bin" / "drun-rendezvous").string(), "--host",
                                     "127.0.0.1", "--port", "0"},
                            .timeout = 60s});
  std::string err;
  CHECK(daemon.waitForOutput([&](const std::string&, const std::string& e) {
    err = e;
    return std::regex_search(e, stamped);
  }, 10s));
  INFO(err);
  RunResult r = run(drunCommand({"/bin/true"}, {"DRUN_LOG_LEVEL=debug"}));
  INFO(r.describe());
  CHECK(r.status() == 0);
  CHECK(std::regex_search(r.err, std::regex(R"((^|\n)drun: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z debug: )")));
}

}  // namespace drun::test::cli_edges

// Helpers of the "Watching a job" tests (observe_events_test.cpp, observe_http_test.cpp): event
// files, a drun-rendezvous with --http, one HTTP GET, the workers' scripts.
// Threading: the test's thread.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "drun/common/test_skip.hpp"
#include "event_lines.hpp"
#include "netns.hpp"
#include "process.hpp"

namespace drun::test::observe {

using nlohmann::json;


using drun::test::ofKind;
using drun::test::readEvents;

// The fields every event carries.
inline void checkCommon(const json& e, const std::string& runId) {
  INFO(e.dump());
  CHECK(e["v"] == 1);
  CHECK(e["event"].is_string());
  CHECK(std::regex_match(e["ts"].get<std::string>(),
                         std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)")));
  CHECK(e["ts_ms"].is_number_integer());
  CHECK(e["run_id"] == runId);
  CHECK(!e["node"].get<std::string>().empty());
  CHECK(e["agent_pid"].get<int64_t>() > 0);
}

inline bool fileHas(const std::filesystem::path& path, const std::string& needle) {
  std::ifstream in(path);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return all.find(needle) != std::string::npos;
}

// Polls a condition on files the job writes (no other way to learn of it), up to `timeout`.
inline bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (condition()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return condition();
}

// One HTTP/1.1 GET on loopback, the whole response (status line, headers, body); "" when the
// connection failed. Each socket call has a 5 s deadline.
inline std::string httpGet(uint16_t port, const std::string& target, const std::string& extraHeaders = "") {
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

inline std::string bodyOf(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return at == std::string::npos ? "" : response.substr(at + 4);
}

inline uint16_t portAfter(const std::string& text, const std::string& marker) {
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
inline std::vector<std::string> failOnceThenWait(int failRank, int failCode, const std::string& goFile) {
  return {"/bin/sh", "-c",
          "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then [ $RANK = " + std::to_string(failRank) +
              " ] && { echo boom >&2; exit " + std::to_string(failCode) + "; }; exit 0; fi; "
              "while [ ! -e " + goFile + " ]; do sleep 0.05; done"};
}

// One agent on namespace host `host`: --nnodes `nnodes` of job `runId` at `endpoint`, with
// --rdzv-conf `conf`, its events in <dir>/events<host>, one worker that waits for <dir>/go.
inline std::unique_ptr<Process> startNamespaceNode(const NetnsCluster& cluster, int host,
                                                   const std::filesystem::path& dir,
                                                   const std::string& endpoint, const std::string& runId,
                                                   const std::string& nnodes, const std::string& conf,
                                                   const MarkerScope& marker) {
  return std::make_unique<Process>(RunOptions{
      .argv = cluster.exec(host, {drunPath().string(), "--nnodes", nnodes, "--rdzv-endpoint", endpoint,
                                  "--rdzv-id", runId, "--rdzv-conf", conf, "--local-addr",
                                  cluster.address(host), "--events",
                                  (dir / ("events" + std::to_string(host))).string(), "/bin/sh", "-c",
                                  "while [ ! -e " + (dir / "go").string() + " ]; do sleep 0.05; done"}),
      .env = {marker.env()},
      .timeout = 90s});
}

}  // namespace drun::test::observe

// drun-rendezvous: the standalone store daemon. Serves the rendezvous of many jobs at once (each
// job's keys live under rdzv/<run_id>/, removed by the job's last agent via deletePrefix).
//
//   drun-rendezvous [--host 0.0.0.0] [--port 29400] [--lease-timeout 10s] [--log-level info]
//                   [--max-connections N] [--max-connections-per-peer N] [--max-lease-timeout 5m]
//                   [--stalled-frame-timeout 30s] [--token-file PATH] [--job-token RUN_ID=PATH]...
//                   [--max-pending-connections 256] [--handshake-timeout 3s]
//                   [--max-stored-bytes 1G] [--max-stored-bytes-per-job 256M]
//                   [--max-call-bytes 256M] [--max-call-bytes-per-connection 64M]
//                   [--max-input-bytes 512M] [--max-output-bytes 512M] [--http [ADDR:]PORT]
//                   [--state-dir DIR] [--max-state-bytes 16M] [--log-format text|json]
//
// Prints "drun-rendezvous listening on HOST:PORT" on stdout once it accepts connections (with
// --port 0, PORT is the one chosen). SIGINT/SIGTERM stop it gracefully.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <iterator>
#include <utility>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <vector>
#include <spdlog/spdlog.h>

#include "drun/common/byte_size.hpp"
#include "drun/common/env.hpp"
#include "drun/common/error.hpp"
#include "drun/common/host_port.hpp"
#include "drun/common/log.hpp"
#include "drun/common/version.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/store/store_server.hpp"
#include "drun/store/token_file.hpp"
#include "monitor/monitor.hpp"
#include "state/state_keeper.hpp"

namespace {

// --max-*-bytes: parseByteSize's forms; none may be 0.
size_t parseBudget(const std::string& text, const std::string& flag) {
  const uint64_t value = drun::parseByteSize(text, flag);
  if (value == 0) throw drun::InvalidArgument(flag + ": must be more than 0");
  return static_cast<size_t>(value);
}

// malloc_trim when the process holds at least 128 MiB more than the server's budgets count.
void returnFreedMemory(const drun::rdzv::StoreServer& server) {
  long pages = 0, resident = 0;
  if (std::FILE* statm = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(statm, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(statm);
  }
  const auto s = server.stats();
  const uint64_t held = s.storedBytes + s.inputBytesBuffered + s.outputBytesQueued + s.callBytesHeld;
  const uint64_t rss = static_cast<uint64_t>(resident) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (rss < held + (uint64_t{128} << 20)) return;
  malloc_trim(0);
  spdlog::debug("returned freed memory: RSS {} MiB, {} MiB held for clients", rss >> 20, held >> 20);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"drun-rendezvous: the drun rendezvous store server"};
  drun::rdzv::StoreServerOptions options;
  std::string leaseTimeout = "10s";
  std::string logLevel;
  std::string logFormat;
  std::string orphanTtl = "60s";
  std::string maxLeaseTimeout = "5m";
  std::string stalledFrameTimeout = "30s";
  std::string tokenFile;
  std::vector<std::string> jobTokens;
  std::string handshakeTimeout = "3s";
  // Byte budgets (docs/protocol.md, "Limits"): flag, option, default text.
  struct ByteFlag {
    const char* flag;
    size_t* option;
    std::string text;
    const char* help;
  };
  std::vector<ByteFlag> byteFlags = {
      {"--max-stored-bytes", &options.maxStoredBytes, "1G", "keys + values the store holds in all"},
      {"--max-stored-bytes-per-job", &options.maxStoredBytesPerJob, "256M",
       "keys + values under one job's rdzv/<id>/"},
      {"--max-call-bytes", &options.maxCallBytes, "256M",
       "blocking calls' keys and wills of all connections"},
      {"--max-call-bytes-per-connection", &options.maxCallBytesPerConnection, "64M",
       "blocking calls' keys and the will of one connection"},
      {"--max-input-bytes", &options.maxInputBytes, "512M", "received, undecoded bytes of all connections"},
      {"--max-output-bytes", &options.maxOutputBytes, "512M",
       "unsent replies of all connections (the heaviest reader is dropped)"},
  };
  app.add_option("--host", options.listen.host, "address to listen on")->capture_default_str();
  app.add_option("--port", options.listen.port, "port to listen on (0 = any; the chosen one is printed)")
      ->capture_default_str();
  app.add_option("--lease-timeout", leaseTimeout,
                 "drop a client silent this long (30, 30s, 500ms, 2m) unless it asks for its own")
      ->capture_default_str();
  app.add_option("--orphan-ttl", orphanTtl,
                 "remove a job's keys this long after its last agent died (0 = never)")
      ->capture_default_str();
  const std::pair<const char*, size_t*> countFlags[] = {
      {"--max-connections", &options.maxConnections},
      {"--max-connections-per-peer", &options.maxConnectionsPerPeer},
      {"--max-pending-connections", &options.maxPendingConnections}};
  const char* countHelp[] = {
      "admitted connections in all; more are refused (Busy)",
      "admitted connections from one address; more are refused (Busy)",
      "connections before their hello (and proof); the oldest is dropped for a new one"};
  for (size_t i = 0; i < std::size(countFlags); ++i)
    app.add_option(countFlags[i].first, *countFlags[i].second, countHelp[i])
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
  app.add_option("--max-lease-timeout", maxLeaseTimeout,
                 "the longest lease a client may ask for (its will runs at most this late)")
      ->capture_default_str();
  app.add_option("--stalled-frame-timeout", stalledFrameTimeout,
                 "drop a client whose frame is not whole this long after its first byte")
      ->capture_default_str();
  app.add_option("--handshake-timeout", handshakeTimeout,
                 "drop a connection whose hello (and proof) is not complete this long after it connected")
      ->capture_default_str();
  for (ByteFlag& f : byteFlags) app.add_option(f.flag, f.text, f.help)->capture_default_str();
  app.add_option("--token-file", tokenFile,
                 "every client must prove this shared secret (a file of mode 600)");
  app.add_option("--job-token", jobTokens,
                 "RUN_ID=PATH: clients of job RUN_ID prove this secret and touch only that job's "
                 "keys (repeatable; with no --token-file, clients of other jobs are refused)");
  std::string httpAddress;
  app.add_option("--http", httpAddress,
                 "[ADDR:]PORT: serve /metrics, /api/jobs and a live page of every job (default off; "
                 "loopback unless ADDR is given; the --token-file token guards it)");
  std::string stateDir;
  std::string maxStateBytes = "16M";
  app.add_option("--state-dir", stateDir,
                 "DIR: keep the jobs' history (their events; an ended job's outcome) in DIR/state.json "
                 "across restarts (written within a second of a change; default off)");
  app.add_option("--max-state-bytes", maxStateBytes,
                 "the cap of DIR/state.json: jobs past it are left out, with a warning")
      ->capture_default_str();
  app.add_option("--log-level", logLevel,
                 "trace, debug, info, warn, error or off (default: DRUN_LOG_LEVEL)");
  app.add_option("--log-format", logFormat,
                 "text (timestamped lines) or json (one object per line: time, level, component, "
                 "message) (default: DRUN_LOG_FORMAT, else text)")
      ->type_name("text|json");
  app.set_version_flag("--version", std::string("drun-rendezvous ") + drun::kVersion,
                       "print the version and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "drun-rendezvous: error: %s (see drun-rendezvous --help)\n", e.what());
    return 2;  // a usage error, as drun's
  }

  try {
    drun::log::init("drun-rendezvous", logLevel, logFormat);
    options.leaseTimeout = drun::env::parseDuration(leaseTimeout, "--lease-timeout");
    options.orphanTtl = drun::env::parseDuration(orphanTtl, "--orphan-ttl");
    options.maxLeaseTimeout = drun::env::parseDuration(maxLeaseTimeout, "--max-lease-timeout");
    options.stalledFrameTimeout =
        drun::env::parseDuration(stalledFrameTimeout, "--stalled-frame-timeout");
    if (options.maxLeaseTimeout < options.minLeaseTimeout)
      throw drun::InvalidArgument("--max-lease-timeout: must be at least " +
                                  std::to_string(options.minLeaseTimeout.count()) + "ms");
    options.handshakeTimeout = drun::env::parseDuration(handshakeTimeout, "--handshake-timeout");
    if (options.handshakeTimeout.count() <= 0)
      throw drun::InvalidArgument("--handshake-timeout: must be more than 0");
    for (const ByteFlag& f : byteFlags) *f.option = parseBudget(f.text, f.flag);
    const size_t stateCap = parseBudget(maxStateBytes, "--max-state-bytes");
    if (options.stalledFrameTimeout.count() <= 0)
      throw drun::InvalidArgument("--stalled-frame-timeout: must be more than 0");
    if (!tokenFile.empty()) options.token = drun::rdzv::readTokenFile(tokenFile, "--token-file");
    for (const std::string& item : jobTokens) {
      auto eq = item.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
        throw drun::InvalidArgument("--job-token '" + item + "': expected RUN_ID=PATH");
      std::string runId = item.substr(0, eq);
      drun::rdzv::keys::validateRunId(runId);
      options.jobTokens[runId] =
          drun::rdzv::readTokenFile(item.substr(eq + 1), "--job-token " + runId);
    }
    if (options.leaseTimeout < options.minLeaseTimeout)
      throw drun::InvalidArgument("--lease-timeout: must be at least " +
                                  std::to_string(options.minLeaseTimeout.count()) + "ms");

    // Block the stop signals before any thread starts, then wait for them on this thread.
    sigset_t stopSignals;
    sigemptyset(&stopSignals);
    sigaddset(&stopSignals, SIGINT);
    sigaddset(&stopSignals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stopSignals, nullptr);
    signal(SIGPIPE, SIG_IGN);

    drun::rdzv::StoreServer server(options);
    std::unique_ptr<drun::rdzv::monitor::Monitor> monitor;
    drun::rdzv::monitor::HttpOptions http;
    if (!httpAddress.empty()) {
      http = drun::rdzv::monitor::parseHttpAddress(httpAddress);
      if (options.token.empty() && !options.jobTokens.empty())
        throw drun::InvalidArgument("--http with --job-token needs --token-file: the page shows every job");
      http.token = options.token;
      monitor = std::make_unique<drun::rdzv::monitor::Monitor>(server, http);
    }
    // After the monitor: the history restored is what its page shows from the start.
    std::unique_ptr<drun::rdzv::state::StateKeeper> keeper;
    if (!stateDir.empty())
      keeper = std::make_unique<drun::rdzv::state::StateKeeper>(
          server, drun::rdzv::state::StateKeeperOptions{
                      .dir = stateDir, .maxBytes = stateCap});
    server.start();
    const std::string listening = drun::HostPort{options.listen.host, server.port()}.toString();
    std::cout << "drun-rendezvous listening on " << listening << std::endl;
    spdlog::info("listening on {} (lease {}ms)", listening, options.leaseTimeout.count());
    if (monitor)
      std::cout << "drun-rendezvous http on " << drun::HostPort{http.address.host, monitor->port()}.toString()
                << std::endl;
    if (options.token.empty() && options.jobTokens.empty())
      spdlog::warn("the store on {} is open to anyone who can reach the port: give it a "
                   "--token-file (and the jobs --rdzv-conf token_file)",
                   listening);

    // Between signals, every 2 s: hand freed memory back to the system (glibc keeps what was
    // freed, e.g. after an attacker's large values were refused or a job's keys deleted).
    int signal = 0;
    const timespec period{2, 0};
    while ((signal = sigtimedwait(&stopSignals, nullptr, &period)) < 0) returnFreedMemory(server);
    spdlog::info("{} received: stopping", signal == SIGINT ? "SIGINT" : "SIGTERM");
    if (monitor) monitor->stop();
    if (keeper) keeper->stop();
    server.stop();
    if (keeper) keeper->finish();  // the last changes, written before the process ends
    auto stats = server.stats();
    spdlog::info("stopped: {} connections served, {} requests, {} protocol errors, {} leases "
                 "expired, {} slow clients dropped, {} wills run",
                 stats.connectionsAccepted, stats.requestsServed, stats.protocolErrors,
                 stats.leasesExpired, stats.slowClientsDropped, stats.willsRun);
    return 0;
  } catch (const drun::InvalidArgument& e) {  // an option's value: a usage error
    std::cerr << "drun-rendezvous: error: " << e.what() << std::endl;
    return 2;
  } catch (const drun::Error& e) {
    std::cerr << "drun-rendezvous: " << e.what() << std::endl;
    return 1;
  }
}

// drun-rendezvous: the standalone store daemon. Serves the rendezvous of many jobs at once (each
// job's keys live under rdzv/<run_id>/, removed by the job's last agent via deletePrefix).
//
//   drun-rendezvous [--host 0.0.0.0] [--port 29400] [--lease-timeout 10s] [--log-level info]
//                   [--max-connections N] [--max-connections-per-peer N] [--max-lease-timeout 5m]
//                   [--stalled-frame-timeout 30s] [--token-file PATH] [--job-token RUN_ID=PATH]...
//
// Prints "drun-rendezvous listening on HOST:PORT" on stdout once it accepts connections (with
// --port 0, PORT is the one chosen). SIGINT/SIGTERM stop it gracefully.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <vector>
#include <spdlog/spdlog.h>

#include "drun/common/env.hpp"
#include "drun/common/error.hpp"
#include "drun/common/log.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/rendezvous/store_server.hpp"
#include "drun/rendezvous/token_file.hpp"

int main(int argc, char** argv) {
  CLI::App app{"drun-rendezvous: the drun rendezvous store server"};
  drun::rdzv::StoreServerOptions options;
  std::string leaseTimeout = "10s";
  std::string logLevel;
  std::string orphanTtl = "60s";
  std::string maxLeaseTimeout = "5m";
  std::string stalledFrameTimeout = "30s";
  std::string tokenFile;
  std::vector<std::string> jobTokens;
  app.add_option("--host", options.host, "address to listen on")->capture_default_str();
  app.add_option("--port", options.port, "port to listen on (0 = any; the chosen one is printed)")
      ->capture_default_str();
  app.add_option("--lease-timeout", leaseTimeout,
                 "drop a client silent this long (30, 30s, 500ms, 2m) unless it asks for its own")
      ->capture_default_str();
  app.add_option("--orphan-ttl", orphanTtl,
                 "remove a job's keys this long after its last agent died (0 = never)")
      ->capture_default_str();
  app.add_option("--max-connections", options.maxConnections,
                 "open connections in all; more are refused")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-connections-per-peer", options.maxConnectionsPerPeer,
                 "open connections from one address; more are refused")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-lease-timeout", maxLeaseTimeout,
                 "the longest lease a client may ask for (its will runs at most this late)")
      ->capture_default_str();
  app.add_option("--stalled-frame-timeout", stalledFrameTimeout,
                 "drop a client whose frame is not whole this long after its first byte")
      ->capture_default_str();
  app.add_option("--token-file", tokenFile,
                 "every client must prove this shared secret (a file of mode 600)");
  app.add_option("--job-token", jobTokens,
                 "RUN_ID=PATH: clients of job RUN_ID prove this secret and touch only that job's "
                 "keys (repeatable; with no --token-file, clients of other jobs are refused)");
  app.add_option("--log-level", logLevel,
                 "trace, debug, info, warn, error or off (default: DRUN_LOG_LEVEL)");
  CLI11_PARSE(app, argc, argv);

  try {
    drun::log::init("drun-rendezvous", logLevel);
    options.leaseTimeout = drun::env::parseDuration(leaseTimeout, "--lease-timeout");
    options.orphanTtl = drun::env::parseDuration(orphanTtl, "--orphan-ttl");
    options.maxLeaseTimeout = drun::env::parseDuration(maxLeaseTimeout, "--max-lease-timeout");
    options.stalledFrameTimeout =
        drun::env::parseDuration(stalledFrameTimeout, "--stalled-frame-timeout");
    if (options.maxLeaseTimeout < options.minLeaseTimeout)
      throw drun::InvalidArgument("--max-lease-timeout: must be at least " +
                                  std::to_string(options.minLeaseTimeout.count()) + "ms");
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
    server.start();
    std::cout << "drun-rendezvous listening on " << options.host << ":" << server.port()
              << std::endl;
    spdlog::info("listening on {}:{} (lease {}ms)", options.host, server.port(),
                 options.leaseTimeout.count());
    if (options.token.empty() && options.jobTokens.empty())
      spdlog::warn("the store on {}:{} is open to anyone who can reach the port: give it a "
                   "--token-file (and the jobs --rdzv-conf token_file)",
                   options.host, server.port());

    int signal = 0;
    sigwait(&stopSignals, &signal);
    spdlog::info("{} received: stopping", signal == SIGINT ? "SIGINT" : "SIGTERM");
    server.stop();
    auto stats = server.stats();
    spdlog::info("stopped: {} connections served, {} requests, {} protocol errors, {} leases "
                 "expired, {} slow clients dropped, {} wills run",
                 stats.connectionsAccepted, stats.requestsServed, stats.protocolErrors,
                 stats.leasesExpired, stats.slowClientsDropped, stats.willsRun);
    return 0;
  } catch (const drun::Error& e) {
    std::cerr << "drun-rendezvous: " << e.what() << std::endl;
    return 1;
  }
}

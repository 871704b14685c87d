// makeC10dRendezvous(options): the embed-the-server policy. The agent on the endpoint host hosts
// the store (an embedded StoreServer); every other agent, or one whose endpoint port is already
// served (another agent on this host, a drun-rendezvous daemon), connects as a client.
#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"
#include "drun/rendezvous/c10d_rendezvous.hpp"
#include "drun/rendezvous/network.hpp"
#include "drun/store/store_server.hpp"
#include "drun/store/tcp_store.hpp"
#include "drun/store/token_file.hpp"

#include <arpa/inet.h>

#include <mutex>

namespace drun::rdzv {
namespace {

// The address the embedded server listens on: the endpoint's own address when it is one, so the
// store is not offered on every interface; "" (all) for a host name, which may resolve to
// another address here (127.0.1.1 on Debian) than on the other nodes.
std::string bindAddress(const std::string& endpointHost) {
  unsigned char binary[16];
  if (::inet_pton(AF_INET, endpointHost.c_str(), binary) == 1 ||
      ::inet_pton(AF_INET6, endpointHost.c_str(), binary) == 1)
    return endpointHost;
  return "";
}

bool isLoopback(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address == "::1";
}

}  // namespace

std::unique_ptr<Rendezvous> makeC10dRendezvous(const RendezvousOptions& options) {
  keys::validateRunId(options.runId);
  if (options.endpoint.host.empty())
    throw InvalidArgument("the c10d rendezvous needs --rdzv-endpoint host[:port]");
  const bool wantHost = options.isHost.value_or(
      isLocalEndpoint(options.endpoint.host, options.localAddr));

  // The store's shared secret: every connection proves it (the host's server included).
  const std::string token = options.tokenFile.empty()
                                ? tokenFromEnvironment()
                                : readTokenFile(options.tokenFile, "--rdzv-conf token_file");
  C10dStoreAccess access;
  TcpStoreOptions client;
  client.endpoint = options.endpoint;
  client.token = token;
  client.scope = options.runId;
  if (wantHost) {
    try {
      StoreServerOptions serverOptions;
      serverOptions.listen = {bindAddress(options.endpoint.host), options.endpoint.port};
      if (serverOptions.listen.host.empty()) serverOptions.listen.host = "0.0.0.0";
      serverOptions.token = token;
      serverOptions.maxLeaseTimeout = std::max<milliseconds>(serverOptions.maxLeaseTimeout,
                                                             options.heartbeatTimeout);
      try {
        access.server = std::make_unique<StoreServer>(serverOptions);
      } catch (const NetworkError& e) {
        // is_host=1 with an endpoint that is not an address of this machine (NAT, a VIP).
        if (e.errorCode() != EADDRNOTAVAIL) throw;
        serverOptions.listen.host = "0.0.0.0";
        access.server = std::make_unique<StoreServer>(serverOptions);
      }
      access.server->start();
      const HostPort hosted{serverOptions.listen.host, access.server->port()};
      client.endpoint = {hosted.host == "0.0.0.0" ? "127.0.0.1" : hosted.host, hosted.port};
      spdlog::info("rendezvous '{}': hosting the store on {}", options.runId, hosted.toString());
      if (token.empty()) {
        static std::once_flag said;
        std::call_once(said, [&] {
          // Loopback: only this machine's users can reach it; else anyone on the network.
          auto level = isLoopback(hosted.host) ? spdlog::level::info : spdlog::level::warn;
          spdlog::log(level,
                      "the rendezvous store on {} is open to anyone who can reach the port "
                      "(no token): give the job one with --rdzv-conf token_file=PATH (mode 600) "
                      "or DRUN_RDZV_TOKEN_FILE",
                      hosted.toString());
        });
      }
    } catch (const NetworkError& e) {
      // Another agent on this host, or a drun-rendezvous daemon, serves the endpoint already.
      // Anything else (a privileged port, no such address) would only end in a join timeout.
      if (e.errorCode() != EADDRINUSE)
        throw NetworkError("rendezvous '" + options.runId + "': cannot host the store on port " +
                           std::to_string(options.endpoint.port) + ": " + e.what(), e.errorCode());
      // Told to host (is_host=1, or the first node of a SLURM step): a client of whatever holds
      // the port would wait for a job that nobody hosts.
      if (options.isHost.value_or(false))
        throw NetworkError("rendezvous '" + options.runId + "': this node is told to host the "
                           "store (is_host=1), but port " + std::to_string(options.endpoint.port) +
                           " on " + bracketedHost(options.endpoint.host) + " is taken (" + e.what() +
                           "): stop what holds it, or pick another --rdzv-endpoint port",
                           EADDRINUSE);
      access.server.reset();
      spdlog::info("rendezvous '{}': not hosting the store ({}); joining {} as a client",
                   options.runId, e.what(), options.endpoint.toString());
    }
  }
  if (client.endpoint.port == 0)
    throw InvalidArgument("--rdzv-endpoint " + options.endpoint.toString() +
                          " only works on the host that serves the store");
  client.connectTimeout = options.joinTimeout;
  client.timeout = options.readTimeout;
  client.heartbeatInterval = options.heartbeatInterval;
  client.leaseTimeout = options.heartbeatTimeout;
  client.onConnectWait = options.say;
  client.progressInterval = options.progressInterval;

  access.endpoint = HostPort{options.endpoint.host, client.endpoint.port}.toString();
  access.workerEndpoint = access.endpoint;
  access.selfAddress = !options.localAddr.empty() ? options.localAddr
                       : access.server          ? options.endpoint.host
                                                : retryWhileTemporary(
                                                      [&] {
                                                        return routeSourceAddress(
                                                            options.endpoint.host, client.endpoint.port);
                                                      },
                                                      options.joinTimeout, options.progressInterval,
                                                      options.say, "--rdzv-conf join_timeout");
  access.store = std::make_unique<TcpStore>(client);
  TcpStoreOptions watcher = client;
  // The watcher's watches last watchSlice (half the heartbeat timeout); an answer may come as late
  // as the rest of the heartbeat timeout: a cut link is still seen within it, and a store host
  // paused for up to half of it is not taken for gone (with 0.5 s of grace, every node fenced its
  // workers after a 0.6 s pause of the store's host).
  watcher.replyGrace = std::max<milliseconds>(
      500ms, options.heartbeatTimeout - watchSlice(options.heartbeatTimeout) - 100ms);
  // Also how the rendezvous reconnects after losing the store: a host that refuses for half a
  // heartbeat timeout is taken for gone (so a fenced node gives up within heartbeat_timeout).
  watcher.connectTimeout = std::min(options.heartbeatTimeout / 2, options.joinTimeout);
  // Its connects are attempts of the reconnector, which says its own progress (the whole
  // reconnect_timeout left): one attempt's window beside it would read as a second deadline.
  watcher.onConnectWait = nullptr;
  access.connectWatcher = [watcher] { return std::make_unique<TcpStore>(watcher); };
  return makeC10dRendezvous(options, std::move(access));
}


}  // namespace drun::rdzv

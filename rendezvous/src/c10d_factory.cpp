// makeC10dRendezvous(options): the embed-the-server policy. The agent on the endpoint host hosts
// the store (an embedded StoreServer); every other agent, or one whose endpoint port is already
// served (another agent on this host, a drun-rendezvous daemon), connects as a client.
#include <cerrno>
#include <cstring>

#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"
#include "drun/rendezvous/c10d_rendezvous.hpp"
#include "drun/rendezvous/network.hpp"
#include "drun/rendezvous/store_server.hpp"
#include "drun/rendezvous/tcp_store.hpp"

namespace drun::rdzv {

std::unique_ptr<Rendezvous> makeC10dRendezvous(const RendezvousOptions& options) {
  keys::validateRunId(options.runId);
  if (options.endpointHost.empty())
    throw InvalidArgument("the c10d rendezvous needs --rdzv-endpoint host[:port]");
  const bool wantHost = options.isHost.value_or(
      isLocalEndpoint(options.endpointHost, options.localAddr));

  C10dStoreAccess access;
  TcpStoreOptions client;
  client.host = options.endpointHost;
  client.port = options.endpointPort;
  if (wantHost) {
    try {
      StoreServerOptions serverOptions;
      serverOptions.port = options.endpointPort;
      serverOptions.maxLeaseTimeout = std::max<milliseconds>(serverOptions.maxLeaseTimeout,
                                                             options.heartbeatTimeout);
      access.server = std::make_unique<StoreServer>(serverOptions);
      access.server->start();
      client.host = "127.0.0.1";
      client.port = access.server->port();
      spdlog::info("rendezvous '{}': hosting the store on port {}", options.runId, client.port);
    } catch (const NetworkError& e) {
      // Another agent on this host, or a drun-rendezvous daemon, serves the endpoint already.
      // Anything else (a privileged port, no such address) would only end in a join timeout.
      if (std::string_view(e.what()).find(std::strerror(EADDRINUSE)) == std::string_view::npos)
        throw NetworkError("rendezvous '" + options.runId + "': cannot host the store on port " +
                           std::to_string(options.endpointPort) + ": " + e.what());
      access.server.reset();
      spdlog::info("rendezvous '{}': not hosting the store ({}); joining {}:{} as a client",
                   options.runId, e.what(), options.endpointHost, options.endpointPort);
    }
  }
  if (client.port == 0)
    throw InvalidArgument("--rdzv-endpoint " + options.endpointHost +
                          ":0 only works on the host that serves the store");
  client.connectTimeout = options.joinTimeout;
  client.timeout = options.readTimeout;
  client.heartbeatInterval = options.heartbeatInterval;
  client.leaseTimeout = options.heartbeatTimeout;
  client.onConnectWait = options.say;
  client.progressInterval = options.progressInterval;

  access.endpoint = options.endpointHost + ":" + std::to_string(client.port);
  access.selfAddress = !options.localAddr.empty() ? options.localAddr
                       : access.server          ? options.endpointHost
                                                : routeSourceAddress(options.endpointHost,
                                                                     client.port);
  access.store = std::make_unique<TcpStore>(client);
  TcpStoreOptions watcher = client;
  // Also how the rendezvous reconnects after losing the store: a host that refuses for half a
  // heartbeat timeout is taken for gone (so a fenced node gives up within heartbeat_timeout).
  watcher.connectTimeout = std::min(options.heartbeatTimeout / 2, options.joinTimeout);
  access.connectWatcher = [watcher] { return std::make_unique<TcpStore>(watcher); };
  return makeC10dRendezvous(options, std::move(access));
}


}  // namespace drun::rdzv

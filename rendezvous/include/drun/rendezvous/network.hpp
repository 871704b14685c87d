// Network helpers of the rendezvous. Each may wait for the resolver, at most net::kResolveTimeout
// (common/resolve.hpp): call them before an event loop starts or on a worker thread, never on a
// loop thread.
#pragma once

#include <cstdint>
#include <string>

namespace drun::rdzv {

// gethostname(), or "localhost" when it is empty.
std::string hostName();
// Whether `host` names this machine: equals `localAddr`, or resolves to a loopback address or
// to an address of one of this host's interfaces (false when it does not resolve in time).
bool isLocalEndpoint(const std::string& host, const std::string& localAddr = {});
// The local address the kernel would use to reach host:port (a connected UDP socket: nothing
// is sent). Throws NetworkError when the host does not resolve (in time) or has no route.
std::string routeSourceAddress(const std::string& host, uint16_t port);

}  // namespace drun::rdzv

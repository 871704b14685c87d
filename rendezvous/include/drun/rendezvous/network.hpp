// Network helpers of the rendezvous. Each may wait for the resolver, at most net::kResolveTimeout
// (common/resolve.hpp): call them before an event loop starts or on a worker thread, never on a
// loop thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace drun::rdzv {

// gethostname(), or "localhost" when it is empty.
std::string hostName();
// Whether `host` names this machine: equals `localAddr`, or resolves to a loopback address or
// to an address of one of this host's interfaces (false when it does not resolve in time).
bool isLocalEndpoint(const std::string& host, const std::string& localAddr = {});
// The local address the kernel would use to reach host:port (a connected UDP socket: nothing
// is sent). Throws NetworkError when the host does not resolve (in time) or has no route; its
// errorCode() is EAGAIN when the resolver failed for now (no answer in time, EAI_AGAIN).
std::string routeSourceAddress(const std::string& host, uint16_t port);

// `attempt()` until it returns, while it fails for now (NetworkError with EAGAIN) and `window`
// lasts: a DNS server down for a moment is waited for, as the store's connect is, with a line to
// `say` at `progressEvery` ("cannot resolve 'h' yet (...); retrying for 25s more (what)"). Any
// other error is thrown at once; past the window, the last one with what ran out.
std::string retryWhileTemporary(const std::function<std::string()>& attempt,
                                std::chrono::milliseconds window, std::chrono::milliseconds progressEvery,
                                const std::function<void(const std::string&)>& say,
                                const std::string& what);

}  // namespace drun::rdzv

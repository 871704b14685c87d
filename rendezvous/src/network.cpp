// Network helpers of the rendezvous: this host's name, whether an endpoint is this host, the
// source address towards a peer. Each may wait for the resolver (at most net::kResolveTimeout):
// never call them on an event loop.
#include "drun/rendezvous/network.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "drun/common/error.hpp"
#include "drun/common/progress.hpp"
#include "drun/common/resolve.hpp"

namespace drun::rdzv {
namespace {

constexpr std::chrono::milliseconds kResolveRetryPause{500};  // between lookups failing for now

bool isLoopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    auto a = ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr);
    return (a >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* a6 = &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a6) ||
           (IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127);
  }
  return false;
}

bool sameAddress(const sockaddr* a, const sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  if (a->sa_family == AF_INET6)
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, 16) == 0;
  return false;
}


}  // namespace

std::string hostName() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host[0] ? host : "localhost";
}


bool isLocalEndpoint(const std::string& host, const std::string& localAddr) {
  if (host.empty()) return false;
  if (!localAddr.empty() && host == localAddr) return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  net::Resolved found = net::resolve(host, "", hints);
  if (!found.addresses) return false;
  addrinfo* resolved = found.addresses.get();
  ifaddrs* interfaces = nullptr;
  ::getifaddrs(&interfaces);
  bool local = false;
  for (addrinfo* ai = resolved; ai && !local; ai = ai->ai_next) {
    if (isLoopback(ai->ai_addr)) local = true;
    for (ifaddrs* i = interfaces; i && !local; i = i->ifa_next)
      if (i->ifa_addr && sameAddress(ai->ai_addr, i->ifa_addr)) local = true;
  }
  if (interfaces) ::freeifaddrs(interfaces);
  return local;
}

std::string routeSourceAddress(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  const std::string service = std::to_string(port == 0 ? 9 : port);
  net::Resolved found = net::resolve(host, service, hints);
  if (!found.addresses) throw NetworkError(found.error, found.temporary ? EAGAIN : 0);
  addrinfo* resolved = found.addresses.get();
  std::string error = "no address";
  for (addrinfo* ai = resolved; ai; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      ::close(fd);
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw = local.ss_family == AF_INET
                            ? static_cast<const void*>(
                                  &reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                            : static_cast<const void*>(
                                  &reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      ::inet_ntop(local.ss_family, raw, text, sizeof text);
      return text;
    }
    error = std::strerror(errno);
    ::close(fd);
  }
  throw NetworkError("no route to '" + host + "': " + error);
}


std::string retryWhileTemporary(const std::function<std::string()>& attempt,
                                std::chrono::milliseconds window, std::chrono::milliseconds progressEvery,
                                const std::function<void(const std::string&)>& say,
                                const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const auto until = Clock::now() + window;
  ProgressPacer progress(progressEvery);
  for (;;) {
    try {
      return attempt();
    } catch (const NetworkError& e) {
      if (e.errorCode() != EAGAIN) throw;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
      if (left.count() <= 0)
        throw NetworkError(std::string(e.what()) + "; still failing after " + humanDuration(window) +
                           " (" + what + ")");
      if (say && progress.due())
        say(std::string(e.what()) + " (for now); retrying for " + humanDuration(left) + " more (" +
            what + ")");
      std::this_thread::sleep_for(std::min(left, kResolveRetryPause));
    }
  }
}

}  // namespace drun::rdzv

// etcdLeaseRevokeNotice: the lease revoke a job guard's watchdog sends once its agent died
// (death_notice.hpp), so that etcd deletes the agent's live key and the others apply its will
// at once, not at the end of the TTL.
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"
#include "drun/common/host_port.hpp"
#include "drun/common/resolve.hpp"
#include "drun/etcd/etcd_store.hpp"
#include "etcd_session.hpp"

namespace drun::rdzv {
namespace {

constexpr milliseconds kNoticeResolveTimeout{1000};

// The member's first address, numeric; nullopt when it does not resolve in time.
std::optional<DeathNotice::Address> numericAddress(const std::string& endpoint) {
  const HostPort member = HostPort::parse(endpoint, {"etcd endpoint"});
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  const net::Resolved found = net::resolve(member.host, std::to_string(member.port), hints, kNoticeResolveTimeout);
  if (!found.addresses) return std::nullopt;
  const addrinfo* a = found.addresses.get();
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw = a->ai_family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr)
                                             : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr);
  if (!::inet_ntop(a->ai_family, raw, text, sizeof text)) return std::nullopt;
  return DeathNotice::Address{text, member.port};
}

}  // namespace

std::optional<DeathNotice> etcdLeaseRevokeNotice(const EtcdSession& session) {
  const EtcdClientOptions& client = session.options().client;
  if (!client.caFile.empty() || !client.user.empty()) {
    spdlog::debug("etcd session: no revoke after death over TLS or with auth (the lease's TTL applies)");
    return std::nullopt;
  }
  DeathNotice notice;
  for (const std::string& endpoint : client.endpoints) {
    try {
      if (auto address = numericAddress(endpoint)) notice.addresses.push_back(*address);
    } catch (const InvalidArgument&) {
      // not an endpoint the client could use either
    }
  }
  if (notice.addresses.empty()) return std::nullopt;
  const std::string body = "{\"ID\":\"" + std::to_string(session.lease()) + "\"}";
  notice.request = "POST /v3/lease/revoke HTTP/1.1\r\nHost: " + client.endpoints.front() +
                   "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                   "\r\nConnection: close\r\n\r\n" + body;
  notice.expectReply = "HTTP/1.1 200";
  return notice;
}

}  // namespace drun::rdzv

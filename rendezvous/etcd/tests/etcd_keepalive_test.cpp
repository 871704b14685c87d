// The TCP keep-alive of the etcd client's connections (etcd_http.hpp): derived from the silence
// bound its session gives it (the lease TTL), so that a member whose host was cut off is given up
// within the TTL, as the lease itself would be.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../src/etcd_http.hpp"
#include "../src/etcd_session.hpp"
#include "etcd_test_options.hpp"

using namespace drun::rdzv;
using namespace std::chrono_literals;
using etcd::KeepAliveProbes;
using etcd::keepAliveProbesFor;

namespace {

int intOption(int fd, int level, int name) {
  int value = -1;
  socklen_t len = sizeof value;
  REQUIRE(::getsockopt(fd, level, name, &value, &len) == 0);
  return value;
}

}  // namespace

TEST_CASE("etcd connection: keep-alive probes are derived from the lease TTL", "[etcd]") {
  // A third of the TTL idle and between probes (whole seconds, at least 1), 2 probes, and the
  // TTL as TCP_USER_TIMEOUT: the connection ends once the TTL passed with no answer.
  const KeepAliveProbes two = keepAliveProbesFor(2s);
  CHECK(two.idleSeconds == 1);
  CHECK(two.intervalSeconds == 1);
  CHECK(two.count == 2);
  CHECK(two.userTimeoutMs == 2000u);
  const KeepAliveProbes nine = keepAliveProbesFor(9s);
  CHECK(nine.idleSeconds == 3);
  CHECK(nine.intervalSeconds == 3);
  CHECK(nine.userTimeoutMs == 9000u);
  const KeepAliveProbes thirty = keepAliveProbesFor(30s);
  CHECK(thirty.idleSeconds == 10);
  CHECK(thirty.idleSeconds + thirty.count * thirty.intervalSeconds == 30);
  CHECK(thirty.userTimeoutMs == 30000u);
  CHECK(keepAliveProbesFor(0ms).idleSeconds == 1);  // never 0: the kernel refuses it

  // What a socket holds once they are applied.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  CHECK(etcd::applyKeepAliveProbes(fd, nine));
  CHECK(intOption(fd, SOL_SOCKET, SO_KEEPALIVE) == 1);
  CHECK(intOption(fd, IPPROTO_TCP, TCP_KEEPIDLE) == 3);
  CHECK(intOption(fd, IPPROTO_TCP, TCP_KEEPINTVL) == 3);
  CHECK(intOption(fd, IPPROTO_TCP, TCP_KEEPCNT) == 2);
  CHECK(intOption(fd, IPPROTO_TCP, TCP_USER_TIMEOUT) == 9000);
  ::close(fd);
}

TEST_CASE("etcd session: its connections give a member up after the lease TTL", "[etcd]") {
  drun::test::EtcdCluster cluster;
  EtcdStoreOptions options = drun::test::etcdStoreOptions(cluster);
  options.leaseTtl = 6s;
  options.client.silentPeerTimeout = 30s;  // the store's own setting: replaced by the TTL
  auto session = openEtcdSession(options);
  CHECK(session->clientOptions().silentPeerTimeout == etcdSessionTtl(*session));
  CHECK(etcdSessionTtl(*session) == 6s);
}

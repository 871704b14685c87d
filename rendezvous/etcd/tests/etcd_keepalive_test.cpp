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
#include "etcd_reply_dropper.hpp"
#include "etcd_test_options.hpp"

#include <thread>

using namespace drun::rdzv;
using namespace std::chrono_literals;
using etcd::KeepAliveProbes;
using etcd::keepAliveProbesFor;
using drun::milliseconds;

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

TEST_CASE("etcd session: a failed keep-alive is retried with a growing, capped delay that still "
          "renews the lease",
          "[etcd]") {
  const auto t0 = drun::Clock::time_point{} + 100s;
  const auto ttl = 8000ms;
  const auto lostAt = t0 + 6000ms;  // 3/4 of the TTL after the last renewal
  auto delay = [&](drun::Clock::time_point now, int failures, double random01) {
    return std::chrono::duration_cast<milliseconds>(keepAliveRetryAt(now, lostAt, failures, ttl, random01) - now);
  };
  // The upper half of a step that doubles from 200 ms: the draw picks the point in it.
  CHECK(delay(t0, 1, 0.0) == 100ms);
  CHECK(delay(t0, 1, 0.999) >= 199ms);
  CHECK(delay(t0, 2, 0.0) == 200ms);
  CHECK(delay(t0, 3, 0.0) == 400ms);
  // Capped at a quarter of the TTL, however many failures.
  CHECK(delay(t0, 5, 1.0) == 2000ms);
  CHECK(delay(t0, 40, 1.0) == 2000ms);
  // Never past the last chance (an eighth of the TTL before lostAt), then one try at lostAt.
  CHECK(keepAliveRetryAt(t0 + 4500ms, lostAt, 5, ttl, 1.0) == t0 + 5000ms);
  CHECK(keepAliveRetryAt(t0 + 5200ms, lostAt, 6, ttl, 0.0) == lostAt);
  CHECK(keepAliveRetryAt(t0 + 6100ms, lostAt, 7, ttl, 0.0) == t0 + 6100ms);
}

TEST_CASE("etcd session: keep-alives refused by the member are spaced out, and the lease is "
          "renewed once it answers again",
          "[etcd]") {
  drun::test::EtcdCluster cluster;
  drun::test::ReplyDropper member(cluster.endpoints()[0]);
  EtcdStoreOptions options = drun::test::etcdStoreOptions(cluster);
  options.client.endpoints = {member.endpoint()};
  options.leaseTtl = 8s;  // keep-alive every 2.67 s; lost 6 s after the last renewal
  auto session = openEtcdSession(options);
  REQUIRE(etcdSessionTtl(*session) == 8s);
  const auto granted = std::chrono::steady_clock::now();
  member.refuse(true);  // 503 "no leader" to every request, as a member cut off from the leader
  std::this_thread::sleep_for(4300ms);
  member.refuse(false);
  const auto refused = member.requestTimes("/v3/lease/keepalive");
  // The first at 2.67 s, then steps of 100-200, 200-400, 400-800 ms: 4 tries by 4.3 s, where a
  // fixed retry would have made one every 200 ms and more. Load only makes the gaps longer.
  REQUIRE(refused.size() >= 3);
  CHECK(refused.size() <= 5);
  for (size_t i = 1; i < refused.size(); ++i)
    CHECK(refused[i] - refused[i - 1] >= milliseconds(90) * (1 << (i - 1)));
  // The next try comes by the last chance (5 s after the grant) and renews the lease.
  std::this_thread::sleep_until(granted + 6500ms);
  CHECK_FALSE(etcdSessionLost(*session));
  const auto all = member.requestTimes("/v3/lease/keepalive");
  REQUIRE(all.size() > refused.size());
  CHECK(all[refused.size()] - granted <= 5100ms);
}

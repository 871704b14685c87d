// StoreServer admission and budgets: the handshake deadline (silent, dripping, no proof), the
// pending cap that drops the oldest pending connection and never an admitted one, and the byte
// budgets of blocking calls, wills and stored data, each refused with the option's name.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "drun/common/error.hpp"
#include "server_test_support.hpp"

using namespace drun::rdzv;
using namespace drun::rdzv::test;

namespace {

std::string helloBytes() {
  wire::Hello h;
  std::string out;
  wire::encodeHello(h, out);
  return out;
}

// A Wait on `count` keys of `keyBytes` bytes that never exist.
wire::Request bigWait(uint64_t id, int count, size_t keyBytes) {
  std::vector<std::string> keys;
  for (int i = 0; i < count; ++i) {
    std::string k = "never/" + std::to_string(id) + "/" + std::to_string(i) + "/";
    keys.push_back(k + std::string(keyBytes - std::min(keyBytes, k.size()), 'x'));
  }
  return request(wire::Op::Wait, std::move(keys), id, 60000);
}

}  // namespace

TEST_CASE("server: a handshake that never completes is dropped at its deadline", "[server][admission]") {
  StoreServerOptions options = localOptions();
  options.handshakeTimeout = 300ms;
  StoreServer server(options);
  server.start();
  const auto start = Clock::now();
  RawClient silent(server.port());    // says nothing
  RawClient dripping(server.port());  // a byte of its hello every 50 ms: 2.4 s for all of it
  const std::string hello = helloBytes();
  bool dripClosed = false;
  for (size_t i = 0; i < hello.size() && !dripClosed; ++i) {
    if (!dripping.trySend(hello.substr(i, 1))) break;
    dripClosed = dripping.closedByServer(50ms);  // the pace of the drip
  }
  CHECK((dripClosed || dripping.closedByServer(2s)));
  CHECK(silent.closedByServer(2s));
  CHECK(Clock::now() - start < 2s);  // 300 ms, not the 2.4 s the drip would take
  CHECK(eventually([&] { return server.stats().handshakesExpired == 2; }));

  // With a token: a hello, then no proof.
  options.token = "s3cret-token-0123456789";
  StoreServer withToken(options);
  withToken.start();
  RawClient noProof(withToken.port());
  noProof.hello();
  CHECK(noProof.helloReply().tokenRequired);
  CHECK(noProof.closedByServer(2s));
  CHECK(eventually([&] { return withToken.stats().handshakesExpired == 1; }));
  CHECK(withToken.stats().authRefused == 1);  // logged: left without proving the token
  TcpStoreOptions o = clientOptions(withToken.port());
  o.token = options.token;
  checkServes(o);
}

TEST_CASE("server: at the pending cap the oldest pending connection is dropped, never an admitted one",
          "[server][admission]") {
  auto started = startServer([](StoreServerOptions& o) {
    o.maxPendingConnections = 4;
    o.maxConnectionsPerPeer = 3;
    o.handshakeTimeout = 60s;
  });
  StoreServer& server = *started;
  TcpStore a(clientOptions(server.port())), b(clientOptions(server.port()));  // admitted
  std::vector<std::unique_ptr<RawClient>> crowd;  // from the same address, never say hello
  for (int i = 0; i < 10; ++i) crowd.push_back(std::make_unique<RawClient>(server.port()));
  REQUIRE(eventually([&] { return server.stats().pendingEvicted == 6; }));
  for (int i = 0; i < 6; ++i) CHECK(crowd[i]->closedByServer(2s));  // the oldest six
  CHECK(server.stats().connectionsPending == 4);
  a.set("k", "v");  // the members are untouched
  CHECK(b.get("k", 1s) == "v");
  // A newcomer from the same address displaces the oldest pending one and is admitted: the
  // per-address cap (3) counts the two members, not the crowd.
  checkServes(clientOptions(server.port()));
  CHECK(crowd[6]->closedByServer(2s));
  CHECK(server.stats().pendingEvicted == 7);
  for (int i = 7; i < 10; ++i) CHECK_FALSE(crowd[i]->closedByServer(50ms));
  CHECK(server.stats().connectionsRefused == 0);
}

TEST_CASE("server: blocking calls and wills over the call budget are refused naming the limit",
          "[server][limits]") {
  auto started = startServer([](StoreServerOptions& o) {
    o.maxCallBytesPerConnection = 256u << 10;
    o.maxCallBytes = 384u << 10;
  });
  StoreServer& server = *started;
  // 100 keys of 500 bytes: about 170 KB held (three copies of each key, with their overhead).
  auto c1 = admitted(server.port());
  c1->request(bigWait(1, 100, 500));
  c1->request(bigWait(2, 100, 500));  // 340 KB on one connection
  auto p = c1->response();
  REQUIRE(p);
  CHECK(p->id == 2);
  CHECK(p->status == wire::Status::InvalidArgument);
  CHECK_THAT(p->message, Catch::Contains("maxCallBytesPerConnection"));
  auto c2 = admitted(server.port());
  c2->request(bigWait(3, 100, 500));  // fits: 340 KB in all
  REQUIRE(eventually([&] { return server.stats().waitersPending == 2; }));
  auto c3 = admitted(server.port());
  c3->request(bigWait(4, 100, 500));  // 510 KB in all
  p = c3->response();
  REQUIRE(p);
  CHECK_THAT(p->message, Catch::Contains("maxCallBytes ") && Catch::Contains("all connections"));
  CHECK(server.stats().overBudget == 2);
  // A will counts too.
  wire::Request will = request(wire::Op::SetWill, {}, 5);
  will.will.sets = {{"rdzv/j/dead", std::string(300u << 10, 'w')}};
  c3->request(will);
  p = c3->response();
  REQUIRE(p);
  CHECK(p->status == wire::Status::InvalidArgument);
  CHECK_THAT(p->message, Catch::Contains("setWill") && Catch::Contains("maxCallBytesPerConnection"));
  // A closed connection gives its share back.
  const uint64_t held = server.stats().callBytesHeld;
  c1.reset();
  REQUIRE(eventually([&] { return server.stats().callBytesHeld < held; }));
  c3->request(bigWait(6, 100, 500));
  CHECK_FALSE(c3->response(300ms));  // waits: no refusal
  CHECK(server.stats().waitersPending == 2);
}

TEST_CASE("server: stored data over a job's share or the total is refused naming the limit",
          "[server][limits]") {
  constexpr size_t kMaxStored = 3u << 20;
  auto started = startServer([](StoreServerOptions& o) {
    o.maxStoredBytes = kMaxStored;
    o.maxStoredBytesPerJob = 2u << 20;
  });
  StoreServer& server = *started;
  TcpStore c(clientOptions(server.port()));
  const std::string mib(1u << 20, 'v');
  c.set("rdzv/a/1", mib);
  try {
    c.set("rdzv/a/2", mib);
    FAIL("a job stored over its share");
  } catch (const drun::InvalidArgument& e) {
    CHECK_THAT(e.what(), Catch::Contains("maxStoredBytesPerJob") && Catch::Contains("rdzv/a/"));
  }
  c.set("rdzv/b/1", mib);
  try {
    c.set("rdzv/c/1", mib);
    FAIL("the store took more than its total");
  } catch (const drun::InvalidArgument& e) {
    CHECK_THAT(e.what(), Catch::Contains("maxStoredBytes "));
  }
  CHECK(c.deletePrefix("rdzv/b/") == 1);
  c.set("rdzv/c/1", mib);
  CHECK(server.stats().storedBytes < kMaxStored);
}

// StoreServer's limits and access: claimed and stalled frames, the connection caps (Busy), the
// input budgets, blocking calls per connection, tokens (the server's and per job).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <thread>

#include "drun/common/deadline.hpp"
#include "drun/common/error.hpp"
#include "drun/store/protocol.hpp"
#include "drun/store/store_server.hpp"
#include "drun/store/tcp_store.hpp"
#include "server_test_support.hpp"

using namespace drun::rdzv;
using namespace std::chrono_literals;
using drun::Deadline;
using Clock = std::chrono::steady_clock;

using namespace drun::rdzv::test;

TEST_CASE("server: a claimed 64 MiB frame costs only the bytes that arrived (48-byte attack)",
          "[server][limits]") {
  StoreServer server(localOptions());
  server.start();
  const size_t before = residentBytes();
  // Three connections, each: a hello asking for a one-hour lease and a header claiming 64 MiB.
  std::vector<std::unique_ptr<RawClient>> attackers;
  for (int i = 0; i < 3; ++i) {
    attackers.push_back(std::make_unique<RawClient>(server.port()));
    attackers.back()->hello(wire::kVersion, 3'600'000);
    attackers.back()->send(frameHeader(64u << 20));
  }
  for (auto& a : attackers) {
    auto reply = a->helloReply();
    CHECK(reply.status == wire::HelloStatus::Ok);
    CHECK(reply.leaseMs == StoreServerOptions{}.maxLeaseTimeout.count());  // minutes, not an hour
  }
  // The server has read all 48 bytes (3 x 16 of headers buffered) ...
  REQUIRE(eventually([&] { return server.stats().inputBytesBuffered == 3 * wire::kHeaderBytes; }));
  CHECK(server.stats().connectionsOpen == 3);
  // ... and holds about that: not the 192 MiB the headers claim.
  const size_t after = residentBytes();
  INFO("resident before " << before << " after " << after);
  CHECK(after < before + (8u << 20));
  checkServes(clientOptions(server.port()));  // others are served meanwhile
}

TEST_CASE("server: a frame that stalls half way is dropped at the stalled-frame deadline",
          "[server][limits]") {
  StoreServerOptions options = localOptions();
  options.stalledFrameTimeout = 300ms;
  StoreServer server(options);
  server.start();
  TcpStore good(clientOptions(server.port()));  // heartbeats, no partial frames: stays
  RawClient stalled(server.port());
  stalled.hello(wire::kVersion, 60'000);
  stalled.send(frameHeader(100) + std::string(10, 'x'));  // 10 of 100 bytes, then nothing
  CHECK(stalled.helloReply().status == wire::HelloStatus::Ok);
  CHECK(stalled.closedByServer(5s));
  CHECK(server.stats().stalledDropped == 1);
  CHECK(server.stats().leasesExpired == 0);
  good.set("after", "fine");
  CHECK(good.get("after", 1s) == "fine");
  CHECK(server.stats().connectionsOpen == 1);
}

TEST_CASE("server: connections over the caps are refused with Busy (per peer and in all)",
          "[server][limits]") {
  StoreServerOptions options = localOptions();
  options.maxConnectionsPerPeer = 3;
  options.maxConnections = 5;
  StoreServer server(options);
  server.start();
  constexpr uint32_t kPeerA = 0x7f000001, kPeerB = 0x7f000002;  // 127.0.0.1, 127.0.0.2
  // A connection from `source` that says hello; the server's answer.
  auto connect = [&](uint32_t source, std::vector<std::unique_ptr<RawClient>>& into) {
    into.push_back(std::make_unique<RawClient>(server.port(), 0, source));
    into.back()->hello();
    return into.back()->helloReply().status;
  };
  std::vector<std::unique_ptr<RawClient>> open, refused;
  for (int i = 0; i < 3; ++i) CHECK(connect(kPeerA, open) == wire::HelloStatus::Ok);
  // A fourth from the same address is refused, with a reply that says why.
  CHECK(connect(kPeerA, refused) == wire::HelloStatus::Busy);
  CHECK(refused.back()->closedByServer());
  try {
    TcpStore tooMany(clientOptions(server.port()));  // also from 127.0.0.1
    FAIL("connected over the per-peer limit");
  } catch (const drun::NetworkError& e) {
    CHECK_THAT(e.what(), Catch::Contains("connection limit"));
  }
  // Another address gets its own share, up to the total.
  for (int i = 0; i < 2; ++i) CHECK(connect(kPeerB, open) == wire::HelloStatus::Ok);
  CHECK(connect(kPeerB, refused) == wire::HelloStatus::Busy);
  CHECK(server.stats().connectionsRefused == 3);
  // A refused connection stays open until its Busy reply is out (a moment, or 1 s at most).
  CHECK(eventually([&] { return server.stats().connectionsOpen == 5; }));
  // A closed connection frees its place.
  open.front()->close();
  REQUIRE(eventually([&] { return server.stats().connectionsOpen == 4; }));
  checkServes(clientOptions(server.port()));  // admitted
}

TEST_CASE("server: input over the per-connection and the server's budget closes the sender",
          "[server][limits]") {
  StoreServerOptions options = localOptions();
  options.maxInputBytesPerConnection = 1u << 20;
  options.maxInputBytes = 3u << 20;
  StoreServer server(options);
  server.start();
  // A frame over the per-connection budget is refused from its header.
  RawClient big(server.port());
  big.hello();
  big.send(frameHeader(2u << 20));
  CHECK(big.helloReply().status == wire::HelloStatus::Ok);
  auto refused = big.response();
  REQUIRE(refused);
  CHECK(refused->status == wire::Status::ProtocolError);
  CHECK_THAT(refused->message, Catch::Contains("input budget"));
  CHECK(big.closedByServer());
  // Frames within it, from several connections, until together they pass the server's budget:
  // the connection whose bytes pass it is closed, the others stay.
  std::vector<std::unique_ptr<RawClient>> senders;
  const std::string partial = frameHeader(1000u << 10) + std::string(900u << 10, 'x');
  for (int i = 0; i < 4; ++i) {
    senders.push_back(std::make_unique<RawClient>(server.port()));
    senders.back()->hello();
    CHECK(senders.back()->helloReply().status == wire::HelloStatus::Ok);
    if (i == 3) {
      senders.back()->trySend(partial);  // the server closes it part way
    } else {
      senders.back()->send(partial);
      REQUIRE(eventually([&] {
        return server.stats().inputBytesBuffered == (i + 1) * partial.size();
      }));
    }
  }
  CHECK(senders.back()->closedByServer());
  CHECK(eventually([&] { return server.stats().connectionsOpen == 3; }));
  CHECK(eventually([&] { return server.stats().inputBytesBuffered == 3 * partial.size(); }));
  // Closing the partial senders gives the budget back.
  senders.clear();
  REQUIRE(eventually([&] { return server.stats().inputBytesBuffered == 0; }));
  TcpStore good(clientOptions(server.port()));
  good.set("k", std::string(500u << 10, 'v'));
  CHECK(good.get("k", 1s).size() == 500u << 10);
}

TEST_CASE("server: too many blocking calls on one connection are refused", "[server][limits]") {
  StoreServerOptions options = localOptions();
  options.maxWaitersPerConnection = 4;
  StoreServer server(options);
  server.start();
  RawClient c(server.port());
  c.hello();
  CHECK(c.helloReply().status == wire::HelloStatus::Ok);
  for (uint64_t id = 1; id <= 5; ++id) c.request(request(wire::Op::Get, {"never"}, id, 30000));
  auto p = c.response();
  REQUIRE(p);
  CHECK(p->id == 5);
  CHECK(p->status == wire::Status::InvalidArgument);
  CHECK_THAT(p->message, Catch::Contains("over 4 blocking calls"));
  // The refusal may be answered before the server's stats show the 4 waiters it keeps.
  CHECK(eventually([&] { return server.stats().waitersPending == 4; }));
}

TEST_CASE("server: with a token every client proves it and a wrong or missing one is refused",
          "[server][access]") {
  StoreServerOptions options = localOptions();
  options.token = "s3cret-token-0123456789";
  StoreServer server(options);
  server.start();
  TcpStoreOptions o = clientOptions(server.port());
  o.token = options.token;
  TcpStore good(o);  // kept: it checks later that the forger wrote nothing
  good.set("k", "v");
  CHECK(good.get("k", 1s) == "v");

  auto refusedWith = [&](const std::string& token) -> std::string {
    TcpStoreOptions c = clientOptions(server.port());
    c.token = token;
    try {
      TcpStore s(c);
      s.set("k", "forged");
    } catch (const drun::AuthError& e) {
      return e.what();
    }
    return "connected";
  };
  CHECK_THAT(refusedWith("wrong-token-0123456789"), Catch::Contains("refused this client's token"));
  CHECK_THAT(refusedWith(""), Catch::Contains("requires a token"));
  CHECK(eventually([&] { return server.stats().authRefused == 2; }));
  // Frames sent without the proof are taken for one, and refused: nothing reaches the store.
  RawClient raw(server.port());
  raw.hello();
  wire::Request set = request(wire::Op::Set, {"k"}, 1);
  set.values = {"forged"};
  std::string frame;
  wire::encodeRequest(set, frame);
  REQUIRE(frame.size() <= wire::kMacBytes);
  raw.send(frame + std::string(wire::kMacBytes - frame.size(), 'x'));  // as long as a proof
  auto reply = raw.helloReply();
  CHECK(reply.status == wire::HelloStatus::Ok);
  CHECK(reply.tokenRequired);
  CHECK(raw.closedByServer());
  CHECK(good.get("k", 1s) == "v");
  CHECK(eventually([&] { return server.stats().authRefused == 3; }));
  // An old client is told the version; a client with a token refuses a store without one.
  RawClient old(server.port());
  old.hello(1);
  CHECK(old.helloReply().status == wire::HelloStatus::VersionMismatch);
  StoreServer open(localOptions());
  open.start();
  TcpStoreOptions toOpen = clientOptions(open.port());
  toOpen.token = options.token;
  CHECK_THROWS_AS(TcpStore(toOpen), drun::AuthError);
}

TEST_CASE("server: per-job tokens: a client of one job touches no other", "[server][access]") {
  StoreServerOptions options = localOptions();
  options.jobTokens = {{"jobA", "token-of-job-A-0123456789"}, {"jobB", "token-of-job-B-0123456789"}};
  StoreServer server(options);
  server.start();
  auto client = [&](const std::string& scope, const std::string& token) {
    TcpStoreOptions o = clientOptions(server.port());
    o.scope = scope;
    o.token = token;
    return std::make_unique<TcpStore>(o);
  };
  auto a = client("jobA", "token-of-job-A-0123456789");
  auto b = client("jobB", "token-of-job-B-0123456789");
  a->set("rdzv/jobA/round", "1");
  b->set("rdzv/jobB/round", "7");
  CHECK(a->get("rdzv/jobA/round", 1s) == "1");
  CHECK_THROWS_AS(a->get("rdzv/jobB/round", 1s), drun::InvalidArgument);
  CHECK_THROWS_AS(a->set("rdzv/jobB/round", "forged"), drun::InvalidArgument);
  CHECK_THROWS_AS(a->deletePrefix("rdzv/"), drun::InvalidArgument);
  CHECK_THROWS_AS(a->numKeys(), drun::InvalidArgument);
  CHECK(b->get("rdzv/jobB/round", 1s) == "7");
  // Another job's token, a job without one, no job: refused.
  CHECK_THROWS_AS(client("jobA", "token-of-job-B-0123456789"), drun::AuthError);
  CHECK_THROWS_AS(client("jobC", "token-of-job-A-0123456789"), drun::AuthError);
  CHECK_THROWS_AS(client("", "token-of-job-A-0123456789"), drun::AuthError);
  CHECK(eventually([&] { return server.stats().authRefused == 3; }));
}

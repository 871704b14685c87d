// StoreServer under failure: closed and silent clients (waiters dropped, will run), garbage,
// stalled and non-reading clients (never stall the others), 1000+ connections on one thread,
// stop() while calls are pending, version and peer checks, orphaned jobs removed. Its limits and
// tokens: store_server_limits_test.cpp; the client and the daemon: store_client_test.cpp.
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
#include <cerrno>
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

TEST_CASE("server: a closed connection's waiters are dropped and its will runs", "[server]") {
  StoreServer server(localOptions());
  server.start();
  TcpStore observer(clientOptions(server.port()));
  {
    RawClient raw(server.port());
    raw.hello();
    raw.helloReply();
    wire::Request will = request(wire::Op::SetWill, {}, 1);
    will.will.sets = {{"node/3/left", "closed"}};
    raw.request(will);
    auto ack = raw.response();
    REQUIRE(ack);
    REQUIRE(ack->status == wire::Status::Ok);
    raw.request(request(wire::Op::Wait, {"never"}, 2, 60000));
    raw.request(request(wire::Op::Watch, {"never"}, 3, 60000));
    REQUIRE(eventually([&] { return server.stats().waitersPending == 2; }));
  }  // closes the socket with both calls pending
  CHECK(observer.get("node/3/left", 5s) == "closed");
  CHECK(eventually([&] { return server.stats().waitersPending == 0; }));
  CHECK(server.stats().willsRun == 1);
  observer.set("never", "now");  // nobody is left to answer: must not touch the closed session
  CHECK(observer.numKeys() == 2);
}

TEST_CASE("server: a silent client is expired after its lease and a heartbeating one is kept",
          "[server]") {
  StoreServer server(localOptions());
  server.start();
  TcpStore observer(clientOptions(server.port()));

  TcpStoreOptions silentOptions = clientOptions(server.port());
  silentOptions.heartbeatInterval = 0ms;
  silentOptions.leaseTimeout = 200ms;
  TcpStore silent(silentOptions);
  CHECK(silent.leaseTimeout() == 200ms);
  Store::Will will;
  will.sets = {{"silent/dead", "1"}};
  // Before the call: the server times the lease from the last byte it heard (the setWill frame),
  // which precedes its answer (taken after it, the measured lease would come out short).
  auto willSet = Clock::now();
  silent.setWill(will);

  TcpStoreOptions liveOptions = clientOptions(server.port());
  liveOptions.heartbeatInterval = 40ms;
  liveOptions.leaseTimeout = 250ms;
  TcpStore live(liveOptions);
  Store::Will liveWill;
  liveWill.sets = {{"live/dead", "1"}};
  live.setWill(liveWill);
  // Blocked in a call for longer than its lease: heartbeats keep it alive meanwhile.
  auto blocked = std::async(std::launch::async, [&] {
    return throwsAs<drun::TimeoutError>([&] { live.get("nothing", 700ms); });
  });

  CHECK(observer.get("silent/dead", 5s) == "1");
  CHECK(Clock::now() - willSet >= 200ms);
  CHECK(blocked.get());
  live.set("live/still", "here");  // the timed-out call left the connection usable
  CHECK_FALSE(observer.tryGet("live/dead"));
  CHECK(server.stats().leasesExpired == 1);
  CHECK_THROWS_AS(silent.numKeys(), drun::NetworkError);

  // A client that stops its heartbeats is expired too.
  live.stopHeartbeatsForTest();
  CHECK(observer.get("live/dead", 5s) == "1");
  CHECK(server.stats().leasesExpired == 2);
}

TEST_CASE("server: garbage gets a protocol error and a close and other clients are unaffected",
          "[server]") {
  StoreServer server(localOptions());
  server.start();
  TcpStore good(clientOptions(server.port()));

  RawClient garbage(server.port());
  garbage.hello();
  garbage.helloReply();
  garbage.send(std::string("\x05\x00\x00\x00\xc8\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00hello", 21));
  auto error = garbage.response();
  REQUIRE(error);
  CHECK(error->status == wire::Status::ProtocolError);
  CHECK_THAT(error->message, Catch::Contains("unknown op 200"));
  CHECK(garbage.closedByServer());

  RawClient huge(server.port());
  huge.hello();
  huge.helloReply();
  huge.send(std::string("\xff\xff\xff\xff\x01\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00", 16));
  auto tooBig = huge.response();
  REQUIRE(tooBig);
  CHECK(tooBig->status == wire::Status::ProtocolError);
  CHECK(huge.closedByServer());

  RawClient foreign(server.port());
  foreign.send("GET / HTTP/1.1\r\n\r\n");
  CHECK(foreign.closedByServer());

  // Stalled mid-frame and mid-hello: the others carry on at full speed.
  RawClient stalledHello(server.port());
  stalledHello.send("dr");
  RawClient stalledFrame(server.port());
  stalledFrame.hello();
  stalledFrame.helloReply();
  stalledFrame.send(std::string("\x40\x00\x00\x00\x01\x00\x00", 7));
  auto started = Clock::now();
  for (int i = 0; i < 200; ++i) good.add("progress", 1);
  CHECK(good.get("progress", 1s) == "200");
  CHECK(Clock::now() - started < 2s);
  CHECK(server.stats().protocolErrors == 3);
}

TEST_CASE("server: a client that never reads is dropped at the output bound", "[server]") {
  StoreServerOptions options = localOptions();
  options.maxOutputQueueBytes = 1 << 20;
  StoreServer server(options);
  server.start();
  TcpStore good(clientOptions(server.port()));
  good.set("big", Bytes(256 << 10, 'x'));

  RawClient reader(server.port(), 4096);
  reader.hello();
  reader.helloReply();
  std::string requests;
  for (uint64_t id = 1; id <= 200; ++id) wire::encodeRequest(request(wire::Op::Get, {"big"}, id, 1000), requests);
  reader.send(requests);  // 50 MB of replies it will never read
  CHECK(eventually([&] { return server.stats().slowClientsDropped == 1; }));
  CHECK(eventually([&] { return server.stats().connectionsOpen == 1; }));
  good.set("after", "fine");
  CHECK(good.get("after", 1s) == "fine");
}

TEST_CASE("server: 1000+ concurrent connections on one io thread", "[server]") {
  StoreServerOptions options = localOptions();
  options.maxConnectionsPerPeer = 2048;  // all of them come from 127.0.0.1
  StoreServer server(options);
  server.start();
  constexpr int kConnections = 1100;
  std::vector<std::unique_ptr<RawClient>> clients;
  clients.reserve(kConnections);
  for (int i = 0; i < kConnections; ++i) {
    clients.push_back(std::make_unique<RawClient>(server.port()));
    clients.back()->hello();
  }
  for (auto& c : clients) {
    CHECK(c->helloReply().status == wire::HelloStatus::Ok);
    c->request(request(wire::Op::Wait, {"go"}, 7, 30000));
  }
  REQUIRE(eventually([&] { return server.stats().waitersPending == kConnections; }));
  CHECK(server.stats().connectionsOpen == kConnections);
  TcpStore starter(clientOptions(server.port()));
  starter.set("go", "1");
  int woken = 0;
  for (auto& c : clients) {
    auto p = c->response();
    if (p && p->status == wire::Status::Ok && p->id == 7) ++woken;
  }
  CHECK(woken == kConnections);
  // And they still serve plain calls.
  for (int i = 0; i < kConnections; i += 100) {
    wire::Request add = request(wire::Op::Add, {"n"}, 8);
    add.delta = 1;
    clients[i]->request(add);
    auto p = clients[i]->response();
    REQUIRE(p);
    CHECK(p->status == wire::Status::Ok);
  }
  CHECK(starter.get("n", 1s) == "11");
}

TEST_CASE("server: pipelined calls are answered by request id", "[server]") {
  StoreServer server(localOptions());
  server.start();
  RawClient raw(server.port());
  raw.hello();
  raw.helloReply();
  raw.request(request(wire::Op::Get, {"later"}, 1, 10000));
  raw.request(request(wire::Op::NumKeys, {}, 2));
  auto numKeys = raw.response();
  REQUIRE(numKeys);
  CHECK(numKeys->id == 2);  // answered while the get is still pending
  wire::Request set = request(wire::Op::Set, {"later"}, 3);
  set.values = {"v"};
  raw.request(set);
  auto first = raw.response();
  auto second = raw.response();
  REQUIRE(first);
  REQUIRE(second);
  // The set is acknowledged, then the get it woke is answered (from a handler of its own).
  CHECK(first->id == 3);
  CHECK(second->id == 1);
  CHECK(second->values == std::vector<Bytes>{"v"});
  // A deadline on the server: answered with Timeout and the missing keys.
  raw.request(request(wire::Op::Wait, {"later", "absent"}, 4, 30));
  auto timedOut = raw.response();
  REQUIRE(timedOut);
  CHECK(timedOut->status == wire::Status::Timeout);
  CHECK(timedOut->keys == std::vector<std::string>{"absent"});
}

TEST_CASE("server: stop() from another thread while calls are pending", "[server]") {
  auto server = std::make_unique<StoreServer>(localOptions());
  server->start();
  std::vector<std::unique_ptr<TcpStore>> clients;
  for (int i = 0; i < 4; ++i) clients.push_back(std::make_unique<TcpStore>(clientOptions(server->port())));
  std::vector<std::future<bool>> blocked;
  for (auto& c : clients)
    blocked.push_back(std::async(std::launch::async, [&c] {
      return throwsAs<drun::NetworkError>([&] { c->get("never", 30s); });
    }));
  REQUIRE(eventually([&] { return server->stats().waitersPending == 4; }));
  auto started = Clock::now();
  std::thread stopper([&] { server->stop(); });
  stopper.join();
  for (auto& b : blocked) {
    REQUIRE(b.wait_for(5s) == std::future_status::ready);
    CHECK(b.get());
  }
  CHECK(Clock::now() - started < 5s);
  server->stop();  // idempotent
  server.reset();
}

TEST_CASE("server: run() on the caller's thread until stop()", "[server]") {
  StoreServer server(localOptions());
  auto serving = std::async(std::launch::async, [&] { server.run(); });
  {
    TcpStore c(clientOptions(server.port()));
    c.set("k", "v");
    CHECK(c.get("k", 1s) == "v");
  }
  server.stop();
  REQUIRE(serving.wait_for(5s) == std::future_status::ready);
}

TEST_CASE("server: a port already served is a NetworkError carrying EADDRINUSE", "[server]") {
  StoreServer first(localOptions());  // listening once constructed
  StoreServerOptions same = localOptions();
  same.listen.port = first.port();
  try {
    StoreServer second(same);
    FAIL("a second server bound the same port");
  } catch (const drun::NetworkError& e) {
    CHECK(e.errorCode() == EADDRINUSE);  // what the c10d rendezvous tells "someone serves it" by
  }
}

TEST_CASE("server: version and peer checks", "[server]") {
  StoreServer server(localOptions());
  server.start();
  RawClient future(server.port());
  future.hello(99);
  auto reply = future.helloReply();
  CHECK(reply.status == wire::HelloStatus::VersionMismatch);
  CHECK(reply.version == wire::kVersion);
  CHECK(future.closedByServer());

  // A client requesting its own lease gets it (clamped to the server's range).
  TcpStoreOptions o = clientOptions(server.port());
  o.leaseTimeout = 2500ms;
  CHECK(TcpStore(o).leaseTimeout() == 2500ms);
  o.heartbeatInterval = 0ms;
  o.leaseTimeout = 1ms;
  CHECK(TcpStore(o).leaseTimeout() == StoreServerOptions{}.minLeaseTimeout);
  o.heartbeatInterval = 3s;
  o.leaseTimeout = 2s;
  CHECK_THROWS_AS(TcpStore(o), drun::InvalidArgument);
}

TEST_CASE("server: a job whose agents all died is removed after the orphan TTL, others stay",
          "[server]") {
  StoreServerOptions o = localOptions();
  o.orphanTtl = 300ms;
  StoreServer server(o);
  server.start();
  TcpStore observer(clientOptions(server.port()));  // no will: names no job
  auto agent = std::make_unique<TcpStore>(clientOptions(server.port()));
  agent->setWill({{{"rdzv/live/0/dead/a", "1"}}, {}, {}});
  agent->set("rdzv/live/round", "1");
  observer.set("rdzv/dead/round", "3");  // a job nobody's will names: its agents are gone
  observer.set("other/key", "kept");     // outside the root: never collected
  CHECK(eventually([&] { return !observer.check({"rdzv/dead/round"}); }));
  CHECK(server.stats().orphanJobsRemoved == 1);
  // The live job is untouched while its agent is connected, however long that is.
  std::this_thread::sleep_for(600ms);  // the scenario itself: two TTLs of a live job
  CHECK(observer.check({"rdzv/live/round"}));
  agent.reset();  // its will runs, then nobody names the job any more
  CHECK(observer.get("rdzv/live/0/dead/a", 5s) == "1");
  CHECK(eventually([&] { return !observer.check({"rdzv/live/round", "rdzv/live/0/dead/a"}); }));
  CHECK(observer.check({"other/key"}));
}

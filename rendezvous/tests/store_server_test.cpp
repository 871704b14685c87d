// StoreServer under failure: closed and silent clients (waiters dropped, will run), garbage,
// stalled and non-reading clients (never stall the others), 1000+ connections on one thread,
// stop() while calls are pending, version and peer checks, connect retries, the daemon.
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
#include "drun/rendezvous/protocol.hpp"
#include "drun/rendezvous/store_server.hpp"
#include "drun/rendezvous/tcp_store.hpp"
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
  // which precedes its answer (taken after it, 196 ms was once measured here).
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
  same.port = first.port();
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

TEST_CASE("client: a peer that is not a drun store is a ProtocolError", "[server]") {
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(listener, 4) == 0);
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  auto peer = std::async(std::launch::async, [listener] {
    int fd = ::accept(listener, nullptr, nullptr);
    const char reply[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
    ::send(fd, reply, sizeof reply - 1, MSG_NOSIGNAL);
    return fd;
  });
  TcpStoreOptions o = clientOptions(ntohs(addr.sin_port));
  try {
    TcpStore s(o);
    FAIL("connected to an HTTP server");
  } catch (const drun::ProtocolError& e) {
    CHECK_THAT(e.what(), Catch::Contains("127.0.0.1:" + std::to_string(ntohs(addr.sin_port))));
  }
  ::close(peer.get());
  ::close(listener);
}

TEST_CASE("client: connect retries until the server listens, and gives up refused at its deadline",
          "[server]") {
  uint16_t port = 0;
  {
    StoreServer probe(localOptions());  // find a free port, then free it
    port = probe.port();
  }
  TcpStoreOptions o = clientOptions(port);
  o.connectTimeout = 300ms;
  auto started = Clock::now();
  try {
    TcpStore s(o);
    FAIL("connected to nothing");
  } catch (const drun::NetworkError& e) {
    // Refused to the end: nothing serves the port (a timeout is for a host that never answers).
    CHECK_THAT(e.what(), Catch::Contains("127.0.0.1:" + std::to_string(port)) &&
                             Catch::Contains("connection refused"));
  }
  CHECK(Clock::now() - started >= 300ms);
  CHECK(Clock::now() - started < 3s);

  // The server appears while the client is retrying.
  o.connectTimeout = 10s;
  auto late = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(150ms);  // the scenario itself: the server starts late
    StoreServerOptions so = localOptions();
    so.port = port;
    StoreServer server(so);
    server.start();
    TcpStore self(clientOptions(port));
    self.wait({"done"}, 10s);
  });
  TcpStore s(o);
  s.set("done", "1");
  late.get();
}

TEST_CASE("daemon: drun-rendezvous prints its port, serves, and stops on SIGTERM", "[server]") {
  DaemonProcess daemon;
  {
    TcpStore c(clientOptions(daemon.port()));
    c.set("rdzv/jobA/x", "1");
    c.set("rdzv/jobB/x", "2");
    CHECK(c.deletePrefix("rdzv/jobA/") == 1);
    CHECK(c.numKeys() == 1);
  }
  CHECK(daemon.stop() == 0);
}

// Chaos seed 40010: the store host paused (SIGSTOP) for longer than the leases; on SIGCONT the
// server's lease timers fired before it read the heartbeats queued meanwhile, ran every live
// agent's will, and a job that had succeeded ended in failure on every node.
TEST_CASE("daemon: a server paused longer than the leases keeps its heartbeating clients",
          "[server]") {
  DaemonProcess daemon;
  TcpStoreOptions o = clientOptions(daemon.port());
  o.heartbeatInterval = 50ms;
  o.leaseTimeout = 300ms;
  TcpStore live(o);
  live.setWill({{{"paused/live/dead", "1"}}, {}, {}});
  TcpStoreOptions silentOptions = o;
  silentOptions.heartbeatInterval = 0ms;  // silent: its lease must still expire after the pause
  TcpStore silent(silentOptions);
  silent.setWill({{{"paused/silent/dead", "1"}}, {}, {}});

  REQUIRE(::kill(daemon.pid(), SIGSTOP) == 0);
  std::this_thread::sleep_for(1200ms);  // the scenario: four leases of the server's own stall
  REQUIRE(::kill(daemon.pid(), SIGCONT) == 0);

  TcpStore observer(clientOptions(daemon.port()));
  CHECK(observer.get("paused/silent/dead", 5s) == "1");
  std::this_thread::sleep_for(300ms);  // one more lease: the live client is heard in it
  CHECK_FALSE(observer.tryGet("paused/live/dead"));
  live.set("paused/live/still", "here");
  CHECK(observer.get("paused/live/still", 5s) == "here");
}

// The same seed, in the paused process itself: the agent hosting the store was stopped while its
// own client waited on a watch; on SIGCONT the client found its reply deadline passed (poll()
// returned a plain timeout, no EINTR) before the server thread beside it had run, declared the
// store lost, and the agent failed a job that had succeeded.
TEST_CASE("client: a call in a process stopped past its deadline waits for its own server's answer",
          "[server]") {
  int ready[2];
  REQUIRE(::pipe2(ready, O_CLOEXEC) == 0);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int code = 3;
    try {
      StoreServer server(localOptions());
      server.start();
      TcpStoreOptions o = clientOptions(server.port());
      o.replyGrace = 300ms;
      TcpStore c(o);
      (void)!::write(ready[1], "r", 1);
      try {
        c.get("never", 800ms);  // answered by the server's Timeout, 800 ms on the server's clock
        code = 2;
      } catch (const drun::TimeoutError&) {
        code = 0;
      } catch (const drun::NetworkError&) {
        code = 1;  // "no reply ... connection presumed lost"
      }
    } catch (...) {
    }
    ::_exit(code);
  }
  ::close(ready[1]);
  char byte = 0;
  pollfd p{ready[0], POLLIN, 0};
  REQUIRE(::poll(&p, 1, 10000) == 1);
  REQUIRE(::read(ready[0], &byte, 1) == 1);
  ::close(ready[0]);
  std::this_thread::sleep_for(300ms);
  REQUIRE(::kill(child, SIGSTOP) == 0);
  std::this_thread::sleep_for(1500ms);  // past the call's 800 ms and its 300 ms grace
  REQUIRE(::kill(child, SIGCONT) == 0);
  int status = 0;
  Deadline deadline(10s);
  while (::waitpid(child, &status, WNOHANG) == 0 && !deadline.expired())
    std::this_thread::sleep_for(10ms);
  if (deadline.expired()) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
  }
  INFO("child exit: 0 = the server's Timeout, 1 = connection presumed lost, 2 = a value, 3 = error");
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
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

TEST_CASE("client: an error text from the server is made printable (it may quote what another "
          "client stored)", "[server]") {
  StoreServer server(localOptions());
  server.start();
  TcpStore writer(clientOptions(server.port()));
  writer.set("counter", "\x1b[2J\x1b]0;evil\x07 not a number");
  TcpStore reader(clientOptions(server.port()));
  std::string what;
  try {
    reader.add("counter", 1);
  } catch (const drun::InvalidArgument& e) {
    what = e.what();
  }
  CHECK_THAT(what, Catch::Contains("not a decimal integer"));
  CHECK(what.find('\x1b') == std::string::npos);
  CHECK(what.find('\x07') == std::string::npos);
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

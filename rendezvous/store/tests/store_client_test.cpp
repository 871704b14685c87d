// The TCP store's client against servers that fail it (a peer that is not a drun store, a server
// not yet listening, a process stopped past its deadline, an error text to print) and the
// drun-rendezvous daemon (its port, SIGTERM, a pause longer than the leases).
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
    so.listen.port = port;
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

// The store host paused (SIGSTOP) for longer than the leases; on SIGCONT the
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

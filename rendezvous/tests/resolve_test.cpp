// Name resolution with a deadline (common/resolve.hpp) and its uses in the rendezvous: a DNS
// server that never answers costs a lookup its deadline, not the resolver's tens of seconds.
//
// The dead resolver: a child process in network and mount namespaces of its own, whose
// /etc/resolv.conf (bind-mounted) names 10.231.254.1, behind a veth whose other end has no
// address: queries leave without error and vanish. SKIPPED where namespaces cannot be made (not root).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "drun/common/error.hpp"
#include "drun/common/resolve.hpp"
#include "drun/common/test_skip.hpp"
#include "drun/rendezvous/network.hpp"
#include "drun/store/tcp_store.hpp"

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kChildCannotIsolate = 3;
constexpr const char* kBlackHoleName = "drun-resolver-test.example";

long msSince(Clock::time_point start) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
}

// In the child: its own namespaces with a resolver that never answers. False when it cannot.
bool isolateWithDeadResolver() {
  if (::unshare(CLONE_NEWNET | CLONE_NEWNS) != 0) return false;
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return false;
  // A veth pair whose far end has no address, and a permanent neighbour entry (no ARP that
  // could fail): queries to 10.231.254.1 are sent and dropped without a word.
  if (std::system("ip link set lo up && ip link add drunbh0 type veth peer name drunbh1 && "
                  "ip addr add 10.231.254.2/24 dev drunbh0 && ip link set drunbh0 up && "
                  "ip link set drunbh1 up && "
                  "ip neigh add 10.231.254.1 lladdr 02:00:00:00:00:01 dev drunbh0 nud permanent") != 0)
    return false;
  char path[] = "/tmp/drun-resolv-XXXXXX";
  int fd = ::mkstemp(path);
  if (fd < 0) return false;
  const std::string conf = "nameserver 10.231.254.1\noptions timeout:30 attempts:3\n";
  bool ok = ::write(fd, conf.data(), conf.size()) == static_cast<ssize_t>(conf.size());
  ::close(fd);
  ok = ok && ::mount(path, "/etc/resolv.conf", nullptr, MS_BIND, nullptr) == 0;
  ::unlink(path);
  return ok;
}

// In the child: each lookup's elapsed ms and error text, one line each ("what\tms\terror").
std::string lookupsAgainstDeadResolver() {
  std::ostringstream out;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  auto start = Clock::now();
  drun::net::Resolved r = drun::net::resolve(kBlackHoleName, "29400", hints, 500ms);
  out << "resolve\t" << msSince(start) << "\t" << (r.timedOut ? "timed out: " : "") << r.error << "\n";

  drun::rdzv::TcpStoreOptions o;
  o.endpoint = {kBlackHoleName, 29400};
  o.connectTimeout = 1500ms;
  start = Clock::now();
  try {
    drun::rdzv::TcpStore store(o);
    out << "connect\t" << msSince(start) << "\tconnected\n";
  } catch (const drun::Error& e) {
    out << "connect\t" << msSince(start) << "\t" << e.what() << "\n";
  }
  start = Clock::now();
  try {
    drun::rdzv::routeSourceAddress(kBlackHoleName, 29400);
    out << "route\t" << msSince(start) << "\tresolved\n";
  } catch (const drun::Error& e) {
    out << "route\t" << msSince(start) << "\t" << e.what() << "\n";
  }
  return out.str();
}

}  // namespace

TEST_CASE("resolve: a name resolves, and one that does not fails with the resolver's reason",
          "[resolve]") {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  drun::net::Resolved local = drun::net::resolve("localhost", "29400", hints, 5s);
  REQUIRE(local.addresses);
  CHECK(local.error.empty());
  drun::net::Resolved bad = drun::net::resolve("no such host!", "29400", hints, 5s);
  CHECK_FALSE(bad.addresses);
  CHECK_THAT(bad.error, Catch::Contains("cannot resolve 'no such host!'"));
}

TEST_CASE("resolve: a resolver that never answers costs each lookup its deadline, with a clear "
          "error (TcpStore connect, routeSourceAddress)", "[resolve][netns]") {
  if (::geteuid() != 0) drun::test::skipTest("needs root for network and mount namespaces");
  int out[2];
  REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(out[0]);
    if (!isolateWithDeadResolver()) ::_exit(kChildCannotIsolate);
    std::string report = lookupsAgainstDeadResolver();
    bool written = ::write(out[1], report.data(), report.size()) == static_cast<ssize_t>(report.size());
    ::_exit(written ? 0 : 1);
  }
  ::close(out[1]);
  std::string report;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) report.append(buf, static_cast<size_t>(n));
  ::close(out[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == kChildCannotIsolate)
    drun::test::skipTest("cannot make network/mount namespaces with a veth pair here");
  INFO(report);
  REQUIRE(WEXITSTATUS(status) == 0);
  std::istringstream lines(report);
  std::string what, ms, error;
  int seen = 0;
  while (std::getline(lines, what, '\t') && std::getline(lines, ms, '\t') && std::getline(lines, error)) {
    INFO(what << " took " << ms << "ms: " << error);
    ++seen;
    CHECK_THAT(error, Catch::Contains(kBlackHoleName) && Catch::Contains("did not answer within"));
    if (what == "resolve") CHECK(std::stol(ms) < 1500);   // its 500 ms deadline, not 90 s
    if (what == "connect") CHECK(std::stol(ms) < 3000);   // its 1500 ms connect deadline
    if (what == "route") CHECK(std::stol(ms) < 7000);     // net::kResolveTimeout (5 s)
  }
  CHECK(seen == 3);
}

TEST_CASE("resolve: a lookup failing for now is retried within the window with progress lines, "
          "and any other error fails at once", "[resolve]") {
  using drun::NetworkError;
  std::vector<std::string> said;
  auto say = [&](const std::string& line) { said.push_back(line); };
  int calls = 0;
  const std::string got = drun::rdzv::retryWhileTemporary(
      [&]() -> std::string {
        if (++calls < 4) throw NetworkError("cannot resolve 'h': Temporary failure in name resolution", EAGAIN);
        return "10.0.0.1";
      },
      10s, 100ms, say, "--rdzv-conf join_timeout");
  CHECK(got == "10.0.0.1");
  CHECK(calls == 4);
  REQUIRE_FALSE(said.empty());  // 1.5 s of failures, a line every 0.1 s after the first second
  CHECK(said[0].find("cannot resolve 'h': Temporary failure in name resolution (for now); retrying for ") == 0);
  CHECK(said[0].find(" more (--rdzv-conf join_timeout)") != std::string::npos);

  calls = 0;
  const auto started = Clock::now();
  try {
    drun::rdzv::retryWhileTemporary(
        [&]() -> std::string {
          ++calls;
          throw NetworkError("cannot resolve 'h': Temporary failure in name resolution", EAGAIN);
        },
        1200ms, 10s, nullptr, "--rdzv-conf join_timeout");
    FAIL("no error");
  } catch (const NetworkError& e) {
    CHECK(std::string(e.what()).find("still failing after 1.2s (--rdzv-conf join_timeout)") != std::string::npos);
  }
  CHECK(calls >= 2);
  CHECK(msSince(started) >= 1150);  // the window, counted from inside the call (ms truncated)

  calls = 0;
  CHECK_THROWS_WITH(drun::rdzv::retryWhileTemporary(
                        [&]() -> std::string {
                          ++calls;
                          throw NetworkError("cannot resolve 'h': Name or service not known");
                        },
                        10s, 100ms, say, "--rdzv-conf join_timeout"),
                    Catch::Contains("Name or service not known"));
  CHECK(calls == 1);  // a name that does not exist is not waited for
  // A real one: the lookup's error says whether it is for now.
  try {
    drun::rdzv::routeSourceAddress("no such host!", 29400);
    FAIL("resolved");
  } catch (const NetworkError& e) {
    CHECK(e.errorCode() != EAGAIN);
  }
}

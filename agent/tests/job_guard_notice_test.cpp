// The job guard's death notice (drun/common/death_notice.hpp): the watchdog sends it once drun
// was SIGKILLed, to the first address that answers as expected, and not after a clean release.
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "drun/agent/job_guard.hpp"
#include "drun/common/death_notice.hpp"

using namespace drun;
using namespace drun::agent;
using namespace std::chrono_literals;

namespace {

// A loopback TCP listener on a free port.
struct NoticeListener {
  int fd = -1;
  uint16_t port = 0;
  NoticeListener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 4) == 0);
    socklen_t length = sizeof a;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &length) == 0);
    port = ntohs(a.sin_port);
  }
  ~NoticeListener() { ::close(fd); }
  // The first connection within `timeout`: what it sent before its reply (up to "\n"), answered
  // with `reply`; nullopt when none came.
  std::optional<std::string> receive(std::chrono::milliseconds timeout, const std::string& reply) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) return std::nullopt;
    const int conn = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) return std::nullopt;
    std::string got;
    char c;
    pollfd q{conn, POLLIN, 0};
    while (got.size() < 256 && ::poll(&q, 1, 2000) == 1 && ::read(conn, &c, 1) == 1 && c != '\n') got += c;
    (void)!::write(conn, reply.data(), reply.size());
    ::close(conn);
    return got;
  }
};

// A forked stand-in for drun: starts a guard, publishes a notice to `ports` (in order), says so
// on the pipe, then either waits to be killed or (`release`) lets its guard go and exits.
pid_t standInWithNotice(const std::vector<uint16_t>& ports, bool release, int* ready) {
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    try {
      std::optional<JobGuard> guard(JobGuard::start());
      DeathNotice notice;
      for (uint16_t port : ports) notice.addresses.push_back({"127.0.0.1", port});
      notice.request = "revoke lease 7\n";
      notice.expectReply = "OK";
      publishDeathNotice(notice);
      (void)!::write(fds[1], "r", 1);
      if (release) {
        guard.reset();
        ::_exit(0);
      }
      for (;;) ::pause();
    } catch (...) {
    }
    ::_exit(1);
  }
  ::close(fds[1]);
  *ready = fds[0];
  return pid;
}

bool waitReady(int fd) {
  pollfd p{fd, POLLIN, 0};
  char c;
  const bool ok = ::poll(&p, 1, 10000) == 1 && ::read(fd, &c, 1) == 1;
  ::close(fd);
  return ok;
}

}  // namespace

TEST_CASE("job guard: drun SIGKILLed: the watchdog sends its death notice, to the next address "
          "when the first does not answer as expected", "[agent]") {
  NoticeListener refuser, accepter;
  int ready = -1;
  const pid_t drun = standInWithNotice({refuser.port, accepter.port}, false, &ready);
  REQUIRE(waitReady(ready));
  ::kill(drun, SIGKILL);
  ::waitpid(drun, nullptr, 0);
  CHECK(refuser.receive(5s, "NO") == std::optional<std::string>("revoke lease 7"));
  CHECK(accepter.receive(5s, "OK") == std::optional<std::string>("revoke lease 7"));
}

TEST_CASE("job guard: a drun that releases its guard withdraws its death notice", "[agent]") {
  NoticeListener listener;
  int ready = -1;
  const pid_t drun = standInWithNotice({listener.port}, true, &ready);
  REQUIRE(waitReady(ready));
  int status = -1;
  REQUIRE(::waitpid(drun, &status, 0) == drun);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK_FALSE(listener.receive(1500ms, "OK").has_value());
}

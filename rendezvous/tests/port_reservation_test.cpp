#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <set>

#include "drun/rendezvous/port_reservation.hpp"

using drun::rdzv::PortReservation;

namespace {
// A server as a plain program writes it: no SO_REUSEADDR.
int bindListen(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 1) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}
}  // namespace

TEST_CASE("a released port is bindable by a plain server and a held one is not", "[rendezvous]") {
  auto r = PortReservation::reserve("127.0.0.1");
  const uint16_t port = r.port();
  REQUIRE(port != 0);
  CHECK(bindListen(port) < 0);  // why the rendezvous releases it before the workers start
  r.release();
  int fd = bindListen(port);
  CHECK(fd >= 0);
  if (fd >= 0) ::close(fd);
  // The same port again (single-node restarts), and another one than the previous round's.
  auto again = PortReservation::tryReserve("127.0.0.1", port);
  REQUIRE(again);
  CHECK(again->port() == port);
  CHECK(PortReservation::reserveOtherThan("127.0.0.1", port).port() != port);
}

TEST_CASE("reserved ports are never handed out twice while held", "[rendezvous]") {
  std::vector<PortReservation> held;
  std::set<uint16_t> ports;
  for (int i = 0; i < 200; ++i) {
    held.push_back(PortReservation::reserve());
    CHECK(ports.insert(held.back().port()).second);
  }
}

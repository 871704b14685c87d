#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <set>

#include "drun/rendezvous/port_reservation.hpp"

using drun::rdzv::PortReservation;

namespace {
int bindListen(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
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

TEST_CASE("a reserved port stays bindable by the worker's own server", "[rendezvous]") {
  auto r = PortReservation::reserve("127.0.0.1");
  REQUIRE(r.port() != 0);
  int fd = bindListen(r.port());
  CHECK(fd >= 0);
  if (fd >= 0) ::close(fd);
}

TEST_CASE("reserved ports are never handed out twice while held", "[rendezvous]") {
  std::vector<PortReservation> held;
  std::set<uint16_t> ports;
  for (int i = 0; i < 200; ++i) {
    held.push_back(PortReservation::reserve());
    CHECK(ports.insert(held.back().port()).second);
  }
}

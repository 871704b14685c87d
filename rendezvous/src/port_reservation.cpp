#include "drun/rendezvous/port_reservation.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "drun/common/error.hpp"

namespace drun::rdzv {

PortReservation PortReservation::reserve(const std::string& host) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw NetworkError(std::string("reserve port: socket: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  // Bind to the master address when it is one of ours, else to any (a hostname, say).
  if (!host.empty() && ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 &&
      (addr.sin_addr.s_addr = htonl(INADDR_ANY),
       ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)) {
    int err = errno;
    ::close(fd);
    throw NetworkError("reserve port on '" + host + "': bind: " + std::strerror(err));
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  PortReservation r;
  r.fd_ = fd;
  r.port_ = ntohs(addr.sin_port);
  return r;
}

PortReservation::PortReservation(PortReservation&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), port_(std::exchange(other.port_, 0)) {}

PortReservation& PortReservation::operator=(PortReservation&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
    port_ = std::exchange(other.port_, 0);
  }
  return *this;
}

PortReservation::~PortReservation() { release(); }

void PortReservation::release() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  port_ = 0;
}

}  // namespace drun::rdzv

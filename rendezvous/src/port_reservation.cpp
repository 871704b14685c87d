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

namespace {

// Binds a SO_REUSEADDR socket to `port` (0: the kernel picks) on `host` when it is one of our
// addresses, else on any. Returns the fd, or -1 with errno set.
int bindPort(const std::string& host, uint16_t port, uint16_t* bound) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  // Bind to the master address when it is one of ours, else to any (a hostname, say).
  if (!host.empty() && ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 &&
      (addr.sin_addr.s_addr = htonl(INADDR_ANY),
       ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)) {
    int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *bound = ntohs(addr.sin_port);
  return fd;
}

}  // namespace

PortReservation PortReservation::reserve(const std::string& host) {
  PortReservation r;
  r.fd_ = bindPort(host, 0, &r.port_);
  if (r.fd_ < 0) throw NetworkError("reserve port on '" + host + "': " + std::strerror(errno));
  return r;
}

PortReservation PortReservation::reserveOtherThan(const std::string& host, uint16_t avoid) {
  PortReservation first = reserve(host);
  if (first.port() != avoid || avoid == 0) return first;
  return reserve(host);  // `first` still holds `avoid`: the kernel picks another
}

std::optional<PortReservation> PortReservation::tryReserve(const std::string& host, uint16_t port) {
  PortReservation r;
  r.fd_ = bindPort(host, port, &r.port_);
  if (r.fd_ < 0) return std::nullopt;
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

#include "drun/rendezvous/port_reservation.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <utility>

#include "drun/common/error.hpp"

namespace drun::rdzv {

namespace {

// Binds a socket to `port` (0: the kernel picks) on `host` when it is one of our addresses, else
// on any. Returns the fd, or -1 with errno set. No SO_REUSEADDR: the kernel then picks (and
// tryReserve accepts) only a port that nothing uses, not even a connection in TIME_WAIT, so that
// once released a plain bind() without SO_REUSEADDR succeeds on it.
int bindPort(const std::string& host, uint16_t port, uint16_t* bound) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
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

std::string readProcFile(const char* path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  return text;
}

// The kernel's ephemeral range; Linux's default when it cannot be read.
PortRange ephemeralRange() {
  std::istringstream in(readProcFile("/proc/sys/net/ipv4/ip_local_port_range"));
  unsigned first = 0, last = 0;
  if (in >> first >> last && first >= 1 && first <= last && last <= 65535)
    return {static_cast<uint16_t>(first), static_cast<uint16_t>(last)};
  return {32768, 60999};
}

// At most this many random draws before the kernel picks: a draw fails only on a port in use.
constexpr int kDraws = 32;

}  // namespace

std::vector<PortRange> parsePortList(const std::string& text) {
  std::vector<PortRange> out;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',') && out.size() < 65536) {
    unsigned first = 0, last = 0;
    char dash = 0, extra = 0;
    std::istringstream one(item);
    if (!(one >> first)) continue;
    if (one >> dash) {
      if (dash != '-' || !(one >> last) || (one >> extra)) continue;
    } else {
      last = first;
    }
    if (first > last || last > 65535) continue;
    out.push_back({static_cast<uint16_t>(first), static_cast<uint16_t>(last)});
  }
  return out;
}

std::vector<PortRange> masterPortRanges(PortRange ephemeral, const std::vector<PortRange>& reserved) {
  std::vector<PortRange> holes = reserved;
  holes.push_back(ephemeral);
  // The well-known defaults of torchrun and drun (the c10d rendezvous endpoint, the static
  // backend's MASTER_PORT): a drawn MASTER_PORT there would take the port from the next job
  // started on this host with the defaults.
  for (uint16_t wellKnown : kWellKnownPorts) holes.push_back({wellKnown, wellKnown});
  std::sort(holes.begin(), holes.end(),
            [](const PortRange& a, const PortRange& b) { return a.first < b.first; });
  std::vector<PortRange> out;
  uint32_t next = kLowestMasterPort;  // the lowest port not yet excluded or emitted
  for (const PortRange& h : holes) {
    if (h.first > next) out.push_back({static_cast<uint16_t>(next), static_cast<uint16_t>(h.first - 1)});
    next = std::max<uint32_t>(next, uint32_t(h.last) + 1);
  }
  if (next <= 65535) out.push_back({static_cast<uint16_t>(next), 65535});
  return out;
}

PortReservation PortReservation::reserve(const std::string& host) {
  const auto ranges = masterPortRanges(
      ephemeralRange(), parsePortList(readProcFile("/proc/sys/net/ipv4/ip_local_reserved_ports")));
  uint32_t total = 0;
  for (const PortRange& r : ranges) total += uint32_t(r.last) - r.first + 1;
  PortReservation r;
  if (total > 0) {
    std::mt19937 gen(std::random_device{}());
    std::uniform_int_distribution<uint32_t> pick(0, total - 1);
    for (int draw = 0; draw < kDraws && r.fd_ < 0; ++draw) {
      uint32_t n = pick(gen);
      for (const PortRange& range : ranges) {
        const uint32_t size = uint32_t(range.last) - range.first + 1;
        if (n < size) {
          r.fd_ = bindPort(host, static_cast<uint16_t>(range.first + n), &r.port_);
          break;
        }
        n -= size;
      }
    }
  }
  if (r.fd_ < 0) r.fd_ = bindPort(host, 0, &r.port_);  // every draw was taken: the kernel picks
  if (r.fd_ < 0) {
    const int error = errno;
    throw NetworkError("reserve port on '" + host + "': " + std::strerror(error), error);
  }
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

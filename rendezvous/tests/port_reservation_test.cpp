#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <set>
#include <string>

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

TEST_CASE("MASTER_PORT is drawn from outside the ephemeral and reserved ranges", "[rendezvous]") {
  using drun::rdzv::masterPortRanges;
  using drun::rdzv::parsePortList;
  using drun::rdzv::PortRange;
  auto spans = [](const std::vector<PortRange>& v) {
    std::vector<std::pair<int, int>> out;
    for (const auto& r : v) out.emplace_back(r.first, r.last);
    return out;
  };
  using Spans = std::vector<std::pair<int, int>>;
  // Linux's default range: two spans, below and above it.
  // 29400 (the rendezvous endpoint's default) and 29500 (the static MASTER_PORT's) are never drawn.
  CHECK(spans(masterPortRanges({32768, 60999}, {})) ==
        Spans{{28000, 29399}, {29401, 29499}, {29501, 32767}, {61000, 65535}});
  // Reserved ports are holes too, overlapping ones included, in any order.
  CHECK(spans(masterPortRanges({32768, 60999}, {{62000, 62010}, {30000, 30000}, {29000, 30000}})) ==
        Spans{{28000, 28999}, {30001, 32767}, {61000, 61999}, {62011, 65535}});
  CHECK(spans(masterPortRanges({60000, 60999}, {{29000, 29450}})) ==
        Spans{{28000, 28999}, {29451, 29499}, {29501, 59999}, {61000, 65535}});
  // A range that covers everything leaves nothing: reserve() then lets the kernel pick.
  CHECK(masterPortRanges({1024, 65535}, {}).empty());
  CHECK(spans(masterPortRanges({1024, 65000}, {})) == Spans{{65001, 65535}});
  CHECK(spans(masterPortRanges({20000, 28000}, {{65535, 65535}})) ==
        Spans{{28001, 29399}, {29401, 29499}, {29501, 65534}});

  CHECK(spans(parsePortList("8080,9000-9010")) == Spans{{8080, 8080}, {9000, 9010}});
  CHECK(parsePortList("").empty());
  // Malformed entries are skipped, the good ones kept.
  CHECK(spans(parsePortList("x,70000,5-3,1-2-3,7 ,12-13")) == Spans{{7, 7}, {12, 13}});

  // On this host: every reserved port lies in one of the ranges.
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  unsigned lo = 0, hi = 0;
  REQUIRE(f >> lo >> hi);
  std::ifstream rf("/proc/sys/net/ipv4/ip_local_reserved_ports");
  std::string reservedText;
  std::getline(rf, reservedText);
  const auto ranges = masterPortRanges({uint16_t(lo), uint16_t(hi)}, parsePortList(reservedText));
  if (ranges.empty()) return;  // the kernel picks; nothing to check
  for (int i = 0; i < 50; ++i) {
    auto r = PortReservation::reserve("127.0.0.1");
    INFO("port " << r.port());
    CHECK(std::any_of(ranges.begin(), ranges.end(),
                      [&](const PortRange& g) { return r.port() >= g.first && r.port() <= g.last; }));
  }
}

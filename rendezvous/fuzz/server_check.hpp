// What the store server is checked for on one byte stream, used by the corpus replay test and
// mutation test (rendezvous/tests/server_corpus_test.cpp). No libFuzzer target: Debian 12's
// clang 14 cannot compile the server's C++20 coroutines against libstdc++ 12 (a future clang
// can: LLVMFuzzerTestOneInput need only call checkServerInput).
//
// The input is an arbitrary byte stream as a peer could send it (a hello, then requests, or
// anything). One in-process StoreServer on 127.0.0.1 (port 0) serves every input: each is
// written to a fresh TCP connection, half-closed, and read until the server closes or a short
// deadline. The server must survive it (ASan/UBSan catch what it does wrong in-process), answer
// only within its bounds, and still serve the next connection: stats() answers and the count of
// open connections stays small (each input's connection is closed before the next).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string_view>

#include "drun/rendezvous/store_server.hpp"
#include "fuzz_support.hpp"

namespace drun::rdzv::fuzz {

inline void requireServer(bool ok, const char* what) { drun::fuzz::require(ok, "server", what); }

inline StoreServer& fuzzServer() {
  static std::unique_ptr<StoreServer> server = [] {
    StoreServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    // Short timeouts: an input that stops mid-frame or blocks on a key costs milliseconds.
    o.handshakeTimeout = std::chrono::milliseconds(200);
    o.leaseTimeout = std::chrono::milliseconds(200);
    o.minLeaseTimeout = std::chrono::milliseconds(50);
    o.maxLeaseTimeout = std::chrono::milliseconds(500);
    o.stalledFrameTimeout = std::chrono::milliseconds(200);
    auto s = std::make_unique<StoreServer>(o);
    s->start();
    return s;
  }();
  return *server;
}

// Writes `input` on a fresh connection and reads until the server closes or `deadline`; returns
// the number of bytes the server sent back.
inline size_t exchange(uint16_t port, std::string_view input, std::chrono::milliseconds deadline) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  requireServer(fd >= 0, "a socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  requireServer(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0,
                "the server accepts a connection after every input");
  const auto end = std::chrono::steady_clock::now() + deadline;
  auto left = [&] {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now()).count();
    return static_cast<int>(ms > 0 ? ms : 0);
  };
  size_t written = 0, received = 0;
  bool open = true;
  while (open && left() > 0) {
    pollfd p{fd, static_cast<short>(POLLIN | (written < input.size() ? POLLOUT : 0)), 0};
    if (::poll(&p, 1, left()) <= 0) break;
    if (p.revents & POLLIN) {
      char buf[65536];
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) open = false;  // the server closed (or reset): done with this input
      else received += static_cast<size_t>(n);
    } else if (p.revents & POLLOUT) {
      ssize_t n = ::send(fd, input.data() + written, input.size() - written, MSG_NOSIGNAL);
      if (n <= 0) break;
      written += static_cast<size_t>(n);
      if (written == input.size()) ::shutdown(fd, SHUT_WR);
    } else {
      break;  // POLLERR/POLLHUP
    }
  }
  ::close(fd);
  return received;
}

inline void checkServerInput(std::string_view data) {
  StoreServer& server = fuzzServer();
  exchange(server.port(), data, std::chrono::milliseconds(300));
  const auto stats = server.stats();
  // Connections of earlier inputs close as the server notices; a leak would grow without bound.
  requireServer(stats.connectionsOpen < 1000, "closed connections do not pile up");
}

}  // namespace drun::rdzv::fuzz

// What the store server is checked for on one byte stream: by the libFuzzer target fuzz_server
// (server_fuzz.cpp, built with clang++ 16, or clang 14 without UBSan's function check: see
// rendezvous/CMakeLists.txt), and in every build by the corpus replay and mutation tests
// (rendezvous/store/tests/server_corpus_test.cpp).
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

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string_view>

#include "drun/store/store_server.hpp"
#include "../../../tests/support/fuzz_support.hpp"

namespace drun::rdzv::fuzz {

inline void requireServer(bool ok, const char* what) { drun::fuzz::require(ok, "server", what); }

// The same for a system call: says its errno before aborting.
inline void requireCall(bool ok, const char* what) {
  if (!ok) std::fprintf(stderr, "server fuzz: %s: %s\n", what, std::strerror(errno));
  requireServer(ok, what);
}

inline StoreServer& fuzzServer() {
  static std::unique_ptr<StoreServer> server = [] {
    StoreServerOptions o;
    o.listen = {"127.0.0.1", 0};
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

// connect() to the server on loopback. A signal (libFuzzer's SIGALRM, its -timeout clock) may
// interrupt it: the connection then goes on in the background, and its outcome is waited for.
inline bool connectLoopback(int fd, uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return true;
  if (errno != EINTR) return false;
  pollfd p{fd, POLLOUT, 0};
  int ready;
  do ready = ::poll(&p, 1, 10000);
  while (ready < 0 && errno == EINTR);
  if (ready == 0) errno = ETIMEDOUT;
  if (ready <= 0) return false;
  int error = 0;
  socklen_t size = sizeof error;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) return false;
  errno = error;
  return error == 0;
}

// Writes `input` on a fresh connection and reads until the server closes or `deadline`; returns
// the number of bytes the server sent back.
inline size_t exchange(uint16_t port, std::string_view input, std::chrono::milliseconds deadline) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  requireCall(fd >= 0, "a socket");
  requireCall(connectLoopback(fd, port), "the server accepts a connection after every input");
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
    const int ready = ::poll(&p, 1, left());
    if (ready < 0 && errno == EINTR) continue;  // a signal, as above: the deadline still holds
    if (ready <= 0) break;
    if (p.revents & POLLIN) {
      char buf[65536];
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) open = false;  // the server closed (or reset): done with this input
      else received += static_cast<size_t>(n);
    } else if (p.revents & POLLOUT) {
      ssize_t n = ::send(fd, input.data() + written, input.size() - written, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
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

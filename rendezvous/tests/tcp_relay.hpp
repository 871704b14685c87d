// TcpRelay: a loopback relay for one TCP connection (the first one accepted) to a server port,
// which a test can cut: while cut it moves no byte either way, so the client's frames (its
// heartbeats) stop reaching the server and the server's stop reaching the client, as over a link
// that is down. Restored, it moves what waited; once one side closed, it closes the other.
// drop() closes both sides, as a client that gave up on the connection and closed it does.
//
// Threading: one thread of its own moves the bytes, in poll slices of 20 ms; cut(), restore() and
// drop() may be called from any thread. Ownership: the destructor stops and joins the thread and closes
// every socket.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <thread>

namespace drun::rdzv::test {

class TcpRelay {
 public:
  explicit TcpRelay(uint16_t serverPort) : serverPort_(serverPort) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback(0);
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listener_, 1) == 0);
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~TcpRelay() {
    stop_ = true;
    thread_.join();
    for (int fd : {listener_, client_, server_})
      if (fd >= 0) ::close(fd);
  }
  TcpRelay(const TcpRelay&) = delete;
  TcpRelay& operator=(const TcpRelay&) = delete;

  uint16_t port() const { return port_; }
  void cut() { cut_ = true; }
  void restore() { cut_ = false; }
  void drop() { drop_ = true; }

 private:
  static sockaddr_in loopback(uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
  }

  void run() {
    while (!stop_) {
      if (client_ < 0) {
        pollfd p{listener_, POLLIN, 0};
        if (::poll(&p, 1, 20) <= 0) continue;
        client_ = ::accept(listener_, nullptr, nullptr);
        if (client_ < 0) continue;
        server_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a = loopback(serverPort_);
        if (::connect(server_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) closeBoth();
        continue;
      }
      if (drop_ && !closed_) closeBoth();
      if (closed_ || cut_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      pollfd p[2] = {{client_, POLLIN, 0}, {server_, POLLIN, 0}};
      if (::poll(p, 2, 20) <= 0) continue;
      for (int i = 0; i < 2 && !closed_; ++i)
        if (p[i].revents && !move(p[i].fd, i == 0 ? server_ : client_)) closeBoth();
    }
  }

  // One read from `from`, written whole to `to`; false when `from` closed or either side failed.
  static bool move(int from, int to) {
    char buf[65536];
    const ssize_t n = ::read(from, buf, sizeof buf);
    for (ssize_t done = 0; n > 0 && done < n;) {
      const ssize_t w = ::send(to, buf + done, size_t(n - done), MSG_NOSIGNAL);
      if (w <= 0) return false;
      done += w;
    }
    return n > 0;
  }

  void closeBoth() {
    ::shutdown(client_, SHUT_RDWR);
    ::shutdown(server_, SHUT_RDWR);
    closed_ = true;
  }

  uint16_t serverPort_;
  uint16_t port_ = 0;
  int listener_ = -1;
  int client_ = -1;  // the relay thread's own, until the destructor
  int server_ = -1;
  bool closed_ = false;
  std::atomic<bool> cut_{false};
  std::atomic<bool> drop_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace drun::rdzv::test

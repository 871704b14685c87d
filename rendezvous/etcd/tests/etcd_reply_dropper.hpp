// ReplyDropper: a TCP relay in front of one etcd member's gateway that, when armed, lets the
// next transaction through to etcd and drops its reply: it waits for etcd's first reply bytes
// (the write is applied by then), runs a hook (another agent's write that lands before the
// retry), then closes the client's connection. The client sees exactly what a member killed
// between applying a write and answering it looks like: a write of unknown outcome.
// Everything else is relayed byte for byte, and the requests are counted and timed. Set to
// refuse, it answers every request itself with 503 UNAVAILABLE (a member with no leader) and
// closes the connection, relaying nothing.
// Threading: an accept thread and a thread per connection, all joined by the destructor;
// dropNextTxnReply/dropped from the test thread.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace drun::test {

class ReplyDropper {
 public:
  // upstream: "127.0.0.1:PORT" (a loopback member of EtcdCluster).
  explicit ReplyDropper(const std::string& upstream) {
    upstream_.sin_family = AF_INET;
    upstream_.sin_port = htons(static_cast<uint16_t>(std::stoi(upstream.substr(upstream.rfind(':') + 1))));
    ::inet_pton(AF_INET, upstream.substr(0, upstream.rfind(':')).c_str(), &upstream_.sin_addr);
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener_, 64) != 0)
      throw std::runtime_error("reply dropper: cannot listen");
    socklen_t len = sizeof addr;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { acceptLoop(); });
  }
  ~ReplyDropper() {
    stop_ = true;
    acceptor_.join();
    std::vector<std::thread> relays;
    {
      std::lock_guard lock(mutex_);
      relays.swap(relays_);
    }
    for (std::thread& relay : relays) relay.join();
    ::close(listener_);
  }
  ReplyDropper(const ReplyDropper&) = delete;
  ReplyDropper& operator=(const ReplyDropper&) = delete;

  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }
  // The next /v3/kv/txn request is applied by etcd but its reply never reaches the client;
  // `beforeDrop` runs once etcd has answered it, before the client's connection is closed.
  void dropNextTxnReply(std::function<void()> beforeDrop) {
    std::lock_guard lock(mutex_);
    beforeDrop_ = std::move(beforeDrop);
    armed_ = true;
  }
  int dropped() const { return dropped_.load(); }
  // While set, every request is answered 503 UNAVAILABLE and its connection closed.
  void refuse(bool on) { refusing_ = on; }
  // When each request to `target` arrived, in order.
  std::vector<std::chrono::steady_clock::time_point> requestTimes(const std::string& target) {
    std::lock_guard lock(mutex_);
    std::vector<std::chrono::steady_clock::time_point> times;
    for (size_t i = 0; i < targets_.size(); ++i)
      if (targets_[i] == target) times.push_back(times_[i]);
    return times;
  }
  // Requests relayed so far to `target` ("/v3/kv/txn", "/v3/kv/range", ...).
  int requests(const std::string& target) {
    std::lock_guard lock(mutex_);
    int n = 0;
    for (const std::string& t : targets_) n += t == target;
    return n;
  }

 private:
  void acceptLoop() {
    while (!stop_) {
      pollfd listening{listener_, POLLIN, 0};
      if (::poll(&listening, 1, 20) <= 0) continue;
      const int client = ::accept(listener_, nullptr, nullptr);
      if (client < 0) continue;
      std::lock_guard lock(mutex_);
      relays_.emplace_back([this, client] { relay(client); });
    }
  }

  void relay(int client) {
    const int upstream = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(upstream, reinterpret_cast<const sockaddr*>(&upstream_), sizeof upstream_) != 0) {
      ::close(upstream);
      ::close(client);
      return;
    }
    bool dropping = false;
    std::function<void()> hook;
    char buf[65536];
    while (!stop_) {
      pollfd fds[2] = {{client, POLLIN, 0}, {upstream, POLLIN, 0}};
      if (::poll(fds, 2, 20) <= 0) continue;
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        const ssize_t n = ::read(client, buf, sizeof buf);
        if (n <= 0) break;
        const std::string chunk(buf, size_t(n));
        {
          std::lock_guard lock(mutex_);
          if (chunk.rfind("POST ", 0) == 0) {
            targets_.push_back(chunk.substr(5, chunk.find(' ', 5) - 5));
            times_.push_back(std::chrono::steady_clock::now());
          }
          if (armed_ && chunk.rfind("POST /v3/kv/txn", 0) == 0) {
            armed_ = false;
            dropping = true;
            hook = std::move(beforeDrop_);
          }
        }
        if (refusing_) {
          static const std::string body = R"({"error":"etcdserver: no leader","code":14,"message":"etcdserver: no leader"})";
          const std::string reply = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                    "Connection: close\r\nContent-Length: " + std::to_string(body.size()) +
                                    "\r\n\r\n" + body;
          writeAll(client, reply.data(), reply.size());
          break;
        }
        if (!writeAll(upstream, buf, size_t(n))) break;
      }
      if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
        const ssize_t n = ::read(upstream, buf, sizeof buf);
        if (n <= 0) break;
        if (dropping) {  // etcd answered: applied. The client never hears of it.
          try {
            if (hook) hook();
          } catch (...) {
            // the test sees the hook's effect missing
          }
          ++dropped_;
          break;
        }
        if (!writeAll(client, buf, size_t(n))) break;
      }
    }
    ::close(upstream);
    ::close(client);
  }

  static bool writeAll(int fd, const char* data, size_t size) {
    while (size > 0) {
      const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
      if (n <= 0) return false;
      data += n;
      size -= size_t(n);
    }
    return true;
  }

  sockaddr_in upstream_{};
  int listener_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> dropped_{0};
  std::atomic<bool> refusing_{false};

  std::mutex mutex_;  // guards armed_, beforeDrop_, relays_, targets_, times_
  std::vector<std::string> targets_;
  std::vector<std::chrono::steady_clock::time_point> times_;
  bool armed_ = false;
  std::function<void()> beforeDrop_;
  std::vector<std::thread> relays_;
  std::thread acceptor_;
};

}  // namespace drun::test

// What the store server's tests share: options for a local server and its clients, a raw wire
// client (speaks the codec directly, or garbage), waiting on a condition with a deadline, this
// process's resident memory.
#pragma once

#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "drun/common/deadline.hpp"
#include "drun/store/protocol.hpp"
#include "drun/store/store_server.hpp"
#include "drun/store/tcp_store.hpp"

namespace drun::rdzv::test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A sanitized build (ASan's quarantine, shadow memory) says nothing about growth through RSS:
// memory bounds are checked only without one (as tests/support/process.hpp's kSanitizedBuild).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kRssIsMeaningful = false;
#else
inline constexpr bool kRssIsMeaningful = true;
#endif

inline StoreServerOptions localOptions() {
  StoreServerOptions o;
  o.listen = {"127.0.0.1", 0};
  return o;
}

// A server on localOptions() changed by `configure`, serving on its own thread.
inline std::unique_ptr<StoreServer> startServer(const std::function<void(StoreServerOptions&)>& configure) {
  StoreServerOptions o = localOptions();
  configure(o);
  auto server = std::make_unique<StoreServer>(o);
  server->start();
  return server;
}

inline TcpStoreOptions clientOptions(uint16_t port) {
  TcpStoreOptions o;
  o.endpoint.port = port;
  o.connectTimeout = 5s;
  o.timeout = 10s;
  o.heartbeatInterval = 100ms;
  o.leaseTimeout = 5s;
  return o;
}

// A fresh, well-behaved client is served: a set and its get (after an attack or at a limit).
inline void checkServes(const TcpStoreOptions& options) {
  TcpStore client(options);
  client.set("k", "v");
  CHECK(client.get("k", 1s) == "v");
}

// Waits for a condition that the server reaches asynchronously (stats); fails at the deadline.
inline bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds timeout = 5s) {
  Deadline deadline(timeout);
  while (!condition()) {
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

// Whether f() throws an E. For calls made on other threads: Catch assertions are not
// thread-safe, so threads return what happened and the test thread checks it.
template <class E, class F>
bool throwsAs(F&& f) {
  try {
    f();
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
  return false;
}

// A hand-driven client on a raw socket: speaks the codec directly, or garbage.
class RawClient {
 public:
  // `source`: the loopback address to connect from (127.0.0.x), 0 = the kernel's choice.
  explicit RawClient(uint16_t port, int receiveBuffer = 0, uint32_t source = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    if (receiveBuffer > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receiveBuffer, sizeof receiveBuffer);
    if (source != 0) {
      sockaddr_in from{};
      from.sin_family = AF_INET;
      from.sin_addr.s_addr = htonl(source);
      REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof from) == 0);
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  }
  ~RawClient() { close(); }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  void send(const std::string& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      REQUIRE(n > 0);
      done += static_cast<size_t>(n);
    }
  }
  // Like send(), for a peer the server may close mid-way: false when it did.
  bool trySend(const std::string& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }
  void hello(uint16_t version = wire::kVersion, uint32_t leaseMs = 0) {
    std::string out;
    wire::Hello h;
    h.version = version;
    h.leaseMs = leaseMs;
    wire::encodeHello(h, out);
    send(out);
  }
  wire::HelloReply helloReply() {
    wire::HelloReply reply;
    for (;;) {
      auto r = wire::decodeHelloReply(in_.data(), reply);
      if (r.status == wire::DecodeStatus::Ok) {
        in_.consume(r.consumed);
        return reply;
      }
      REQUIRE(r.status == wire::DecodeStatus::NeedMore);
      REQUIRE(receive(5s));
    }
  }
  void request(wire::Request q) {
    std::string out;
    wire::encodeRequest(q, out);
    send(out);
  }
  // The next response, or nullopt when the server closed the connection.
  std::optional<wire::Response> response(std::chrono::milliseconds timeout = 5s) {
    Deadline deadline(timeout);
    for (;;) {
      wire::Response p;
      auto r = wire::decodeResponse(in_.data(), p);
      if (r.status == wire::DecodeStatus::Ok) {
        in_.consume(r.consumed);
        return p;
      }
      REQUIRE(r.status == wire::DecodeStatus::NeedMore);
      if (!receive(deadline.remaining())) return std::nullopt;
    }
  }
  // True once the server has closed the connection (EOF), false at the timeout.
  bool closedByServer(std::chrono::milliseconds timeout = 5s) {
    Deadline deadline(timeout);
    while (!deadline.expired()) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(deadline.remaining().count())) <= 0) return false;
      char buf[4096];
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return true;
    }
    return false;
  }

 private:
  // Reads some bytes; false on EOF/error/timeout.
  bool receive(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
    ssize_t n = ::recv(fd_, in_.prepare(65536), 65536, 0);
    if (n <= 0) return false;
    in_.commit(static_cast<size_t>(n));
    return true;
  }

  int fd_ = -1;
  wire::ReceiveBuffer in_;
};

// A frame header claiming a body of `length` bytes (a Set), as a hostile peer sends it.
// A raw client past its hello (the server answered Ok), asking for `leaseMs` (0: the server's).
inline std::unique_ptr<RawClient> admitted(uint16_t port, uint32_t leaseMs = 0) {
  auto c = std::make_unique<RawClient>(port);
  c->hello(wire::kVersion, leaseMs);
  REQUIRE(c->helloReply().status == wire::HelloStatus::Ok);
  return c;
}

inline std::string frameHeader(uint32_t length, uint64_t id = 1) {
  wire::Request q;
  q.op = wire::Op::Set;
  q.id = id;
  q.keys = {"k"};
  q.values = {""};
  std::string frame;
  wire::encodeRequest(q, frame);
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return frame.substr(0, wire::kHeaderBytes);
}

// This process's resident memory (it hosts the server under test), from /proc/self/status.
inline size_t residentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  FAIL("no VmRSS in /proc/self/status");
  return 0;
}

inline wire::Request request(wire::Op op, std::vector<std::string> keys, uint64_t id,
                      uint32_t timeoutMs = 0) {
  wire::Request q;
  q.op = op;
  q.keys = std::move(keys);
  q.id = id;
  q.timeoutMs = timeoutMs;
  return q;
}

// drun-rendezvous (built with these tests) as a child process on 127.0.0.1, port 0: start()
// reads the port it prints (its log level: error); the destructor stops it (SIGTERM, then
// SIGKILL) and reaps it.
class DaemonProcess {
 public:
  explicit DaemonProcess(std::vector<std::string> extraArgs = {}) {
    namespace fs = std::filesystem;
    fs::path binary;
    if (const char* dir = std::getenv("DRUN_BUILD_DIR")) binary = fs::path(dir) / "bin" / "drun-rendezvous";
    if (binary.empty() || !fs::exists(binary))
      binary = fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "bin" / "drun-rendezvous";
    INFO("drun-rendezvous is built with these tests (a dependency): " << binary);
    REQUIRE(fs::exists(binary));
    std::vector<std::string> args = {binary.string(), "--host", "127.0.0.1", "--port", "0",
                                     "--log-level", "error"};
    args.insert(args.end(), extraArgs.begin(), extraArgs.end());
    int out[2];
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    std::string line;
    Deadline deadline(std::chrono::seconds(10));
    while (line.find('\n') == std::string::npos && !deadline.expired()) {
      pollfd p{out[0], POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(deadline.remaining().count())) <= 0) break;
      char buf[256];
      ssize_t n = ::read(out[0], buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, static_cast<size_t>(n));
    }
    ::close(out[0]);
    const std::string prefix = "drun-rendezvous listening on 127.0.0.1:";
    REQUIRE_THAT(line, Catch::StartsWith(prefix));
    port_ = static_cast<uint16_t>(std::stoi(line.substr(prefix.size())));
  }
  ~DaemonProcess() {
    if (pid_ > 0 && stop() < 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  // SIGTERM and the exit status (-1 when it did not exit within 10 s or by a signal).
  int stop() {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGTERM);
    Deadline deadline(std::chrono::seconds(10));
    int status = 0;
    while (!deadline.expired()) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  // VmRSS of the daemon in bytes (0 once it is gone).
  size_t residentBytes() const {
    std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(status, line))
      if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
    return 0;
  }

 private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

}  // namespace drun::rdzv::test

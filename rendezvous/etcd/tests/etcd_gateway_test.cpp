// The etcd client against a fake gateway that answers with malformed replies: each is a clear
// error (ProtocolError / TimeoutError naming the call), never a crash or a hang.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "drun/common/error.hpp"
#include "drun/etcd/etcd_client.hpp"

using namespace drun;
using namespace drun::rdzv;
using namespace std::chrono_literals;

namespace {

// Answers every request on every connection with `reply` (or, when empty, never answers).
class FakeGateway {
 public:
  explicit FakeGateway(std::string reply) : reply_(std::move(reply)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listener_, 16) == 0);
    socklen_t len = sizeof addr;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeGateway() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
    for (int fd : open_) ::close(fd);
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  void serve() {
    std::vector<pollfd> fds;
    while (!stop_) {
      fds.assign(1, {listener_, POLLIN, 0});
      for (int fd : open_) fds.push_back({fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) open_.push_back(::accept(listener_, nullptr, nullptr));
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
        char buf[65536];
        const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
        if (n > 0 && !reply_.empty()) (void)!::write(fds[i].fd, reply_.data(), reply_.size());
      }
    }
  }
  std::string reply_;
  int listener_ = -1;
  uint16_t port_ = 0;
  std::vector<int> open_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::string http200(const std::string& body) {
  return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

EtcdClientOptions quick(const FakeGateway& gateway) {
  EtcdClientOptions o;
  o.endpoints = {gateway.endpoint()};
  o.callTimeout = 600ms;
  o.attemptTimeout = 300ms;
  return o;
}

}  // namespace

TEST_CASE("etcd client: malformed gateway replies are protocol errors", "[etcd]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not JSON", http200("not json!")},
      {"a JSON array", http200("[1,2]")},
      {"bad base64 key", http200(R"({"kvs":[{"key":"!!!!"}]})")},
      {"kvs not an array", http200(R"({"kvs":"x"})")},
      {"revision not a number", http200(R"({"header":{"revision":"12x"}})")},
      {"value of the wrong type", http200(R"({"kvs":[{"key":"YQ==","value":7}]})")},
      {"not HTTP", "hello there\r\n\r\n"},
      {"a body over the limit", "HTTP/1.1 200 OK\r\nContent-Length: 999999999999\r\n\r\n{"},
  };
  for (const auto& [name, reply] : cases) {
    INFO(name);
    FakeGateway gateway(reply);
    EtcdClient client(quick(gateway));
    CHECK_THROWS_AS(client.range("a"), ProtocolError);
  }
  FakeGateway txn(http200(R"({"succeeded":"yes"})"));
  EtcdClient client(quick(txn));
  CHECK_THROWS_AS(client.txn({}, {EtcdOp::range("a")}, {}, true), ProtocolError);
}

TEST_CASE("etcd client: an error reply is an error naming etcd's message", "[etcd]") {
  FakeGateway gateway("HTTP/1.1 400 Bad Request\r\nContent-Length: 60\r\n\r\n"
                      R"({"error":"x","message":"etcdserver: too many ops","code":3}    )");
  EtcdClient client(quick(gateway));
  CHECK_THROWS_WITH(client.put("a", "b"), Catch::Contains("too many ops"));
}

TEST_CASE("etcd client: a refusal carries etcd's code, by which lease-not-found is known", "[etcd]") {
  auto refusal = [](int code, const std::string& message) {
    const std::string body = R"({"error":"x","message":")" + message + R"(","code":)" + std::to_string(code) + "}";
    return "HTTP/1.1 404 Not Found\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  };
  auto putRefusal = [](EtcdClient& client) {
    try {
      client.put("a", "b");
    } catch (const EtcdError& e) {
      return e;
    }
    FAIL("the put was not refused");
    return EtcdError("", 0);
  };
  FakeGateway gone(refusal(5, "etcdserver: requested lease not found"));
  EtcdClient client(quick(gone));
  const EtcdError notFound = putRefusal(client);
  CHECK(notFound.code() == EtcdError::kNotFound);
  CHECK(notFound.leaseNotFound());
  client.leaseRevoke(7, Deadline(2s));  // a lease already gone is what a revoke wants
  // The words alone (a message that quotes them) are not the code.
  FakeGateway quoted(refusal(9, "etcdserver: key 'lease not found' is locked"));
  EtcdClient other(quick(quoted));
  const EtcdError otherRefusal = putRefusal(other);
  CHECK(otherRefusal.code() == 9);
  CHECK_FALSE(otherRefusal.leaseNotFound());
  CHECK_THROWS_AS(other.leaseRevoke(7, Deadline(2s)), EtcdError);
}

TEST_CASE("etcd client: a gateway that never answers is a timeout within the deadline", "[etcd]") {
  FakeGateway silent("");
  EtcdClient client(quick(silent));
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(client.range("a"), TimeoutError);
  CHECK(std::chrono::steady_clock::now() - start < 3s);
}

TEST_CASE("etcd client: a malformed watch stream is a protocol error", "[etcd]") {
  const std::string line = R"({"result":{"events":[{"type":"BOGUS","kv":{}}]}})";
  char size[16];
  std::snprintf(size, sizeof size, "%zx", line.size() + 1);
  FakeGateway gateway("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + std::string(size) +
                      "\r\n" + line + "\n\r\n");
  EtcdClient client(quick(gateway));
  CHECK_THROWS_AS(client.watch("a", {}, 0, Deadline(2s), [](const auto&) { return true; }),
                  ProtocolError);
}

TEST_CASE("etcd client: a watch refused as unavailable (no leader) goes on to the next member, and "
          "through an election until its deadline",
          "[etcd]") {
  const std::string body = R"({"error":"etcdserver: no leader","code":14,"message":"etcdserver: no leader"})";
  const std::string reply = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body;
  FakeGateway first(reply), second(reply);
  EtcdClientOptions options = quick(first);
  options.endpoints = {first.endpoint(), second.endpoint()};
  EtcdClient client(options);
  // Both members refuse as a cluster electing a leader does: the watch goes from one to the other
  // with pauses until its deadline, then ends as a watch that saw nothing in time (the store's
  // caller looks again; its lease, not the watch, judges the store lost), naming the refusal.
  const auto started = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(client.watch("a", {}, 0, Deadline(1500ms), [](const auto&) { return true; }), TimeoutError);
  CHECK(std::chrono::steady_clock::now() - started >= 1s);  // the last pause may end it early
  CHECK_THROWS_WITH(client.watch("a", {}, 0, Deadline(500ms), [](const auto&) { return true; }),
                    Catch::Contains("no leader"));
}

TEST_CASE("etcd client: a watch on members that all refuse the connection ends at once as a lost store",
          "[etcd]") {
  EtcdClientOptions options;
  options.endpoints = {"127.0.0.1:1", "127.0.0.1:2"};
  EtcdClient client(options);
  const auto started = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(client.watch("a", {}, 0, Deadline(10s), [](const auto&) { return true; }),
                    Catch::Contains("no member serves the watch"));
  CHECK(std::chrono::steady_clock::now() - started < 5s);
}

TEST_CASE("etcd client: endpoint lists are parsed and bad ones refused", "[etcd]") {
  CHECK(parseEtcdEndpoints("h1:2379, h2,[::1]:2380") ==
        std::vector<std::string>{"h1:2379", "h2:2379", "[::1]:2380"});
  CHECK(parseEtcdEndpoints("http://h1:1") == std::vector<std::string>{"h1:1"});
  CHECK_THROWS_AS(parseEtcdEndpoints(""), InvalidArgument);
  CHECK_THROWS_AS(parseEtcdEndpoints("h1:99999"), InvalidArgument);
  CHECK_THROWS_AS(parseEtcdEndpoints("::1:2379"), InvalidArgument);
}

TEST_CASE("etcd client: a CA file that cannot be loaded is refused naming etcd_cacert", "[etcd]") {
  EtcdClientOptions o;
  o.endpoints = {"127.0.0.1:1"};
  o.caFile = "/nonexistent/ca.pem";
  CHECK_THROWS_WITH(EtcdClient(o), Catch::Contains("etcd_cacert") && Catch::Contains("/nonexistent/ca.pem"));
}

TEST_CASE("etcd client: every member answering UNAVAILABLE (no leader) is a cluster without a quorum, "
          "said in words", "[etcd]") {
  // The gateway's answer for gRPC code 14; the message is not what the client goes by.
  const std::string body = R"({"error":"something else","code":14,"message":"something else"})";
  const std::string reply = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body;
  FakeGateway first(reply), second(reply);
  EtcdClientOptions options = quick(first);
  options.endpoints = {first.endpoint(), second.endpoint(), "127.0.0.1:1"};  // the third refuses
  options.callTimeout = 1s;
  EtcdClient client(options);
  CHECK_THROWS_WITH(client.range("a"), Catch::Contains("etcd has no quorum") &&
                                           Catch::Contains("2 of 3 member(s) answered that they have no leader") &&
                                           Catch::Contains("the others did not answer"));
}

TEST_CASE("etcd client: a call ended by interrupt() says why", "[etcd]") {
  FakeGateway silent("");
  EtcdClient client(quick(silent));
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    client.interrupt("this agent lost its etcd lease: no member renewed it");
  });
  CHECK_THROWS_WITH(client.range("a"), Catch::Contains("interrupted: this agent lost its etcd lease"));
  stopper.join();
}

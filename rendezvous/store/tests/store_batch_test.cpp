// StoreBatch (store_batch.hpp): the same meaning on every store (MemoryStore's one step under its
// lock, TcpStore's pipelined batch against the real server): order, results, a failure in the middle,
// the bound on its size; TcpStore's batch sent whole before any answer is awaited, over a lost
// connection, and against a server whose answers cannot be trusted (a scripted fake server).
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <future>
#include <memory>
#include <string>

#include "drun/common/error.hpp"
#include "drun/store/memory_store.hpp"
#include "drun/store/store_batch.hpp"
#include "server_test_support.hpp"

namespace drun::rdzv::test {
namespace {

struct StoreUnderTest {
  std::unique_ptr<StoreServer> server;  // for the TcpStore
  std::unique_ptr<LivenessStore> store;
  std::unique_ptr<LivenessStore> other;  // a second client of the same store
};

StoreUnderTest makeStore(bool tcp) {
  StoreUnderTest s;
  if (!tcp) {
    auto shared = MemoryStore::makeShared();
    s.store = std::make_unique<MemoryStore>(shared);
    s.other = std::make_unique<MemoryStore>(shared);
    return s;
  }
  s.server = startServer([](StoreServerOptions&) {});
  s.store = std::make_unique<TcpStore>(clientOptions(s.server->port()));
  s.other = std::make_unique<TcpStore>(clientOptions(s.server->port()));
  return s;
}

// A fake store server on loopback: answers the hello (Ok, no token), then hands the connection to
// `script`, which reads requests and writes what it likes. One client.
class FakeServer {
 public:
  using Script = std::function<void(int fd, wire::ReceiveBuffer& in)>;
  explicit FakeServer(Script script) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listener_, 4) == 0);
    socklen_t len = sizeof addr;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    done_ = std::async(std::launch::async, [this, script = std::move(script)] {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 10000) <= 0) return;
      int fd = ::accept(listener_, nullptr, nullptr);
      wire::ReceiveBuffer in;
      wire::Hello hello;
      while (wire::decodeHello(in.data(), hello).status == wire::DecodeStatus::NeedMore)
        if (!receive(fd, in)) return;
      in.consume(wire::decodeHello(in.data(), hello).consumed);
      wire::HelloReply reply;
      reply.leaseMs = 5000;
      std::string out;
      wire::encodeHelloReply(reply, out);
      sendAll(fd, out);
      script(fd, in);
      ::close(fd);
    });
  }
  ~FakeServer() {
    done_.wait();
    ::close(listener_);
  }
  uint16_t port() const { return port_; }

  static bool receive(int fd, wire::ReceiveBuffer& in) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) <= 0) return false;
    ssize_t n = ::recv(fd, in.prepare(4096), 4096, 0);
    if (n <= 0) return false;
    in.commit(static_cast<size_t>(n));
    return true;
  }
  // The next `n` requests, or fewer when the client stops sending (10 s).
  static std::vector<wire::Request> requests(int fd, wire::ReceiveBuffer& in, size_t n) {
    std::vector<wire::Request> out;
    while (out.size() < n) {
      wire::Request q;
      auto r = wire::decodeRequest(in.data(), q);
      if (r.status == wire::DecodeStatus::Ok) {
        in.consume(r.consumed);
        if (q.op == wire::Op::Batch)  // its parts, as a server takes it apart
          for (wire::Request& part : q.parts) out.push_back(std::move(part));
        else if (q.op != wire::Op::Heartbeat)
          out.push_back(std::move(q));
        continue;
      }
      if (r.status == wire::DecodeStatus::Bad || !receive(fd, in)) break;
    }
    return out;
  }
  static void sendAll(int fd, const std::string& bytes) {
    ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  static wire::Response okFor(const wire::Request& q) {
    wire::Response p;
    p.op = q.op;
    p.id = q.id;
    if (q.op == wire::Op::CompareSet) p.values = {"v"};
    return p;
  }
  static std::string encoded(const std::vector<wire::Response>& answers) {
    std::string out;
    for (const auto& p : answers) wire::encodeResponse(p, out);
    return out;
  }
  static void answer(int fd, const std::vector<wire::Response>& answers) {
    sendAll(fd, encoded(answers));
  }

 private:
  int listener_ = -1;
  uint16_t port_ = 0;
  std::future<void> done_;
};

TcpStoreOptions fakeClientOptions(uint16_t port) {
  TcpStoreOptions o = clientOptions(port);
  o.heartbeatInterval = 0ms;  // the scripts count requests
  o.timeout = 2s;
  return o;
}

}  // namespace

TEST_CASE("store batch: operations run in order and return what each call returns",
          "[store][batch]") {
  const bool tcp = GENERATE(false, true);
  INFO((tcp ? "TcpStore (pipelined)" : "MemoryStore (sequential default)"));
  auto s = makeStore(tcp);
  s.other->set("cas", "old");
  StoreBatch batch;
  const size_t absent = batch.tryGet("k");
  batch.set("k", "v1");
  const size_t seen = batch.tryGet("k");
  const size_t first = batch.add("n", 5);
  const size_t second = batch.add("n", -2);
  const size_t swapped = batch.compareSet("cas", "old", "new");
  const size_t kept = batch.compareSet("cas", "old", "other");
  batch.append("k", "+x");
  const size_t appended = batch.tryGet("k");
  Store::Will will;
  will.sets = {{"gone", "1"}};
  batch.setWill(will);
  s.store->runBatch(batch);

  CHECK(batch.value(absent) == std::nullopt);
  CHECK(batch.value(seen) == std::optional<Bytes>("v1"));
  CHECK(batch.number(first) == 5);
  CHECK(batch.number(second) == 3);
  CHECK(batch.value(swapped) == std::optional<Bytes>("new"));
  CHECK(batch.value(kept) == std::optional<Bytes>("new"));
  CHECK(batch.value(appended) == std::optional<Bytes>("v1+x"));
  for (size_t i = 0; i < batch.size(); ++i) CHECK(batch.ok(i));
  // The will was registered: it runs when this client goes.
  CHECK_FALSE(s.other->tryGet("gone"));
  s.store.reset();
  CHECK(s.other->get("gone", 5s) == "1");
}

TEST_CASE("store batch: deleteKey and deletePrefix answer what they removed", "[store][batch]") {
  const bool tcp = GENERATE(false, true);
  INFO((tcp ? "TcpStore (pipelined)" : "MemoryStore (sequential default)"));
  auto s = makeStore(tcp);
  for (const char* key : {"gone", "dir/a", "dir/b", "kept"}) s.other->set(key, "v");
  StoreBatch batch;
  const size_t existed = batch.deleteKey("gone");
  const size_t missing = batch.deleteKey("never");
  const size_t prefix = batch.deletePrefix("dir/");
  CHECK_THROWS_AS(batch.deletePrefix(""), InvalidArgument);  // never sent: it would remove all
  s.store->runBatch(batch);
  CHECK(batch.number(existed) == 1);
  CHECK(batch.number(missing) == 0);
  CHECK(batch.number(prefix) == 2);
  CHECK(s.other->numKeys() == 1);
  CHECK(s.other->tryGet("kept") == std::optional<Bytes>("v"));
}

TEST_CASE("store batch: a failure in the middle leaves the others run and is thrown after them",
          "[store][batch]") {
  const bool tcp = GENERATE(false, true);
  INFO((tcp ? "TcpStore (pipelined)" : "MemoryStore (sequential default)"));
  auto s = makeStore(tcp);
  s.other->set("text", "not a number");
  StoreBatch batch;
  const size_t before = batch.add("n", 1);
  const size_t bad = batch.add("text", 1);  // the store refuses: not an integer
  const size_t after = batch.add("n", 1);
  const size_t read = batch.tryGet("n");
  CHECK_THROWS_AS(s.store->runBatch(batch), InvalidArgument);
  CHECK(batch.ok(before));
  CHECK_FALSE(batch.ok(bad));
  CHECK_THROWS_AS(batch.number(bad), InvalidArgument);
  CHECK(batch.ok(after));
  CHECK(batch.number(after) == 2);
  CHECK(batch.value(read) == std::optional<Bytes>("2"));
  // The connection is still in step: the next call gets its own answer.
  CHECK(s.store->add("n", 10) == 12);
}

TEST_CASE("store batch: an operation the client cannot encode is not sent, the others are",
          "[store][batch]") {
  auto s = makeStore(true);
  StoreBatch batch;
  batch.set("a", "1");
  const size_t tooLong = batch.set(std::string(kStoreLimits.maxKeyBytes + 1, 'k'), "v");
  batch.set("b", "2");
  CHECK_THROWS_AS(s.store->runBatch(batch), InvalidArgument);
  CHECK_FALSE(batch.ok(tooLong));
  CHECK(s.other->tryGet("a") == std::optional<Bytes>("1"));
  CHECK(s.other->tryGet("b") == std::optional<Bytes>("2"));
  CHECK(s.store->numKeys() == 2);
}

TEST_CASE("store batch: at most kMaxOps operations", "[store][batch]") {
  StoreBatch batch;
  for (size_t i = 0; i < StoreBatch::kMaxOps; ++i) batch.add("n", 1);
  CHECK_THROWS_AS(batch.add("n", 1), InvalidArgument);
  CHECK(batch.size() == StoreBatch::kMaxOps);
  auto s = makeStore(true);
  s.store->runBatch(batch);
  CHECK(batch.number(StoreBatch::kMaxOps - 1) == int64_t(StoreBatch::kMaxOps));
}

TEST_CASE("store batch: TcpStore sends every request before it waits for an answer",
          "[store][batch]") {
  // The fake server answers nothing until all three requests are in: a client that waited for
  // each answer in turn would time out.
  FakeServer fake([](int fd, wire::ReceiveBuffer& in) {
    auto qs = FakeServer::requests(fd, in, 3);
    std::vector<wire::Response> answers;
    for (const auto& q : qs) {
      auto p = FakeServer::okFor(q);
      if (q.op == wire::Op::Add) p.number = 7;
      answers.push_back(p);
    }
    if (qs.size() == 3) FakeServer::answer(fd, answers);
    FakeServer::requests(fd, in, 1);  // until the client goes
  });
  TcpStore store(fakeClientOptions(fake.port()));
  StoreBatch batch;
  batch.set("a", "1");
  const size_t read = batch.tryGet("a");
  const size_t sum = batch.add("n", 1);
  store.runBatch(batch);
  CHECK(batch.value(read) == std::nullopt);
  CHECK(batch.number(sum) == 7);
}

TEST_CASE("store batch: a connection lost mid-batch is a NetworkError", "[store][batch]") {
  SECTION("the server answers the first request and closes") {
    FakeServer fake([](int fd, wire::ReceiveBuffer& in) {
      auto qs = FakeServer::requests(fd, in, 3);
      if (!qs.empty()) FakeServer::answer(fd, {FakeServer::okFor(qs[0])});
    });
    TcpStore store(fakeClientOptions(fake.port()));
    StoreBatch batch;
    const size_t first = batch.set("a", "1");
    const size_t second = batch.set("b", "2");
    batch.set("c", "3");
    CHECK_THROWS_AS(store.runBatch(batch), NetworkError);
    CHECK(batch.ok(first));
    CHECK_FALSE(batch.ok(second));
    CHECK_THROWS_AS(store.set("d", "4"), NetworkError);  // the connection stays lost
  }
  SECTION("the connection was interrupted before the batch") {
    auto server = startServer([](StoreServerOptions&) {});
    TcpStore store(clientOptions(server->port()));
    store.interrupt();
    StoreBatch batch;
    batch.set("a", "1");
    CHECK_THROWS_AS(store.runBatch(batch), NetworkError);
  }
}

TEST_CASE("store batch: answers a sound store would not give are a ProtocolError",
          "[store][batch]") {
  // Each case: the bytes the fake server answers the batch's two requests with.
  using Reply = std::function<std::string(const std::vector<wire::Request>&)>;
  using F = FakeServer;
  const std::vector<std::pair<std::string, Reply>> cases = {
      {"answers out of order",
       [](const auto& qs) { return F::encoded({F::okFor(qs[1]), F::okFor(qs[0])}); }},
      {"a compareSet answered without the value now stored",
       [](const auto& qs) {
         wire::Response empty = F::okFor(qs[1]);
         empty.op = wire::Op::Set;  // an empty body, then relabelled as compareSet's
         std::string bytes = F::encoded({empty});
         bytes[4] = static_cast<char>(wire::Op::CompareSet);
         return F::encoded({F::okFor(qs[0])}) + bytes;
       }},
      {"a tryGet answered with bytes after its value",
       [](const auto& qs) {
         wire::Response p = F::okFor(qs[0]);
         p.values = {"x"};
         std::string bytes = F::encoded({p});
         bytes[0] = static_cast<char>(bytes[0] + 5);  // the body claims 5 more bytes
         return bytes + "extra" + F::encoded({F::okFor(qs[1])});
       }},
      {"an answer with another op",
       [](const auto& qs) {
         auto p = F::okFor(qs[0]);
         p.op = wire::Op::Set;
         return F::encoded({p, F::okFor(qs[1])});
       }},
      {"an answer to a request never sent",
       [](const auto& qs) {
         auto p = F::okFor(qs[0]);
         p.id = qs[1].id + 5;
         return F::encoded({p});
       }},
  };
  for (const auto& [name, reply] : cases) {
    INFO(name);
    FakeServer fake([&reply = reply](int fd, wire::ReceiveBuffer& in) {
      auto qs = FakeServer::requests(fd, in, 2);
      if (qs.size() == 2) FakeServer::sendAll(fd, reply(qs));
      FakeServer::requests(fd, in, 1);  // until the client goes
    });
    TcpStore store(fakeClientOptions(fake.port()));
    StoreBatch batch;
    batch.tryGet("a");
    batch.compareSet("b", "", "v");
    CHECK_THROWS_AS(store.runBatch(batch), ProtocolError);
    CHECK_THROWS_AS(store.set("c", "1"), NetworkError);  // dropped: the stream is out of step
  }
}

TEST_CASE("server: pipelined requests are answered in order, in one read when they fit",
          "[server][batch]") {
  auto server = startServer([](StoreServerOptions&) {});
  RawClient raw(server->port());
  raw.hello();
  raw.helloReply();
  std::string frames;
  for (uint64_t id = 1; id <= 20; ++id) {
    wire::Request q = request(wire::Op::Add, {"n"}, id);
    q.delta = 1;
    wire::encodeRequest(q, frames);
  }
  raw.send(frames);
  for (uint64_t id = 1; id <= 20; ++id) {
    auto p = raw.response();
    REQUIRE(p);
    CHECK(p->id == id);
    CHECK(p->number == int64_t(id));
  }
}

}  // namespace drun::rdzv::test

namespace drun::rdzv::test {

TEST_CASE("store batch: MemoryStore applies a batch in one step, and a closed handle applies none",
          "[store][batch]") {
  auto shared = MemoryStore::makeShared();
  MemoryStore observer(shared);
  // A watcher woken by the batch's first write finds its last one there too: no other client
  // runs between two of its operations (as on the server, which serves a batch in one pass).
  for (int i = 0; i < 50; ++i) {
    const std::string first = "first/" + std::to_string(i), last = "last/" + std::to_string(i);
    auto seen = std::async(std::launch::async, [&] {
      MemoryStore watcher(shared);
      watcher.watch(first, std::nullopt, std::chrono::seconds(10));
      return watcher.tryGet(last).has_value();
    });
    MemoryStore writer(shared);
    StoreBatch batch;
    batch.set(first, "1");
    batch.set(last, "1");
    writer.runBatch(batch);
    CHECK(seen.get());
  }
  // The will and the count in one batch; closeForTest runs the will and refuses what follows.
  MemoryStore node(shared);
  StoreBatch in;
  in.setWill({{}, {{"present", -1}}, {}});
  in.add("present", 1);
  node.runBatch(in);
  CHECK(observer.tryGet("present") == std::optional<Bytes>("1"));
  node.closeForTest();
  CHECK(observer.tryGet("present") == std::optional<Bytes>("0"));
  StoreBatch again;
  again.add("present", 1);
  CHECK_THROWS_AS(node.runBatch(again), NetworkError);
  CHECK_THROWS_AS(node.add("present", 1), NetworkError);
  CHECK(observer.tryGet("present") == std::optional<Bytes>("0"));
}

}  // namespace drun::rdzv::test

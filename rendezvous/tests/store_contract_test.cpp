// The Store contract, run against every implementation: MemoryStore and TcpStore+StoreServer, and
// (the cases that hold for it: not the wire's limits or messages) EtcdStore on a private etcd
// cluster (EtcdFixture; SKIPPED without etcd). Each fixture hands out "clients" (a MemoryStore
// handle / a TcpStore connection / an EtcdStore with a session, a lease, of its own) on one store.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "drun/common/error.hpp"
#include "drun/store/memory_store.hpp"
#include "drun/store/store_core.hpp"
#include "drun/store/store_server.hpp"
#include "drun/store/tcp_store.hpp"
#include "etcd_test_options.hpp"

using namespace drun::rdzv;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

struct MemoryFixture {
  std::shared_ptr<MemoryStore::Shared> shared = MemoryStore::makeShared();
  std::unique_ptr<LivenessStore> client() { return std::make_unique<MemoryStore>(shared); }
};

struct TcpFixture {
  StoreServer server{[] {
    StoreServerOptions o;
    o.listen = {"127.0.0.1", 0};
    return o;
  }()};
  TcpFixture() { server.start(); }
  std::unique_ptr<LivenessStore> client() {
    TcpStoreOptions o;
    o.endpoint.port = server.port();
    o.connectTimeout = 5s;
    o.timeout = 10s;
    o.heartbeatInterval = 200ms;
    o.leaseTimeout = 5s;
    return std::make_unique<TcpStore>(o);
  }
};

struct EtcdFixture {
  drun::test::EtcdCluster cluster;
  std::unique_ptr<LivenessStore> client() {
    return std::make_unique<EtcdStore>(openEtcdSession(drun::test::etcdStoreOptions(cluster)));
  }
};

template <class F>
auto later(F f) {
  return std::async(std::launch::async, std::move(f));
}

}  // namespace

TEMPLATE_TEST_CASE("store: set, get, tryGet, check, numKeys, delete", "[store]", MemoryFixture,
                   TcpFixture, EtcdFixture) {
  TestType fx;
  auto s = fx.client();
  CHECK(s->numKeys() == 0);
  CHECK_FALSE(s->tryGet("a"));
  CHECK_FALSE(s->check({"a"}));
  s->set("a", "1");
  s->set("b", std::string("\0bin\xff", 5));
  CHECK(s->get("a", 1s) == "1");
  CHECK(s->get("b", 1s) == std::string("\0bin\xff", 5));
  CHECK(s->tryGet("a") == std::optional<Bytes>("1"));
  CHECK(s->check({"a", "b"}));
  CHECK_FALSE(s->check({"a", "c"}));
  CHECK(s->check({}));
  CHECK(s->numKeys() == 2);
  s->set("a", "");  // empty values are values
  CHECK(s->tryGet("a") == std::optional<Bytes>(""));
  CHECK(s->deleteKey("a"));
  CHECK_FALSE(s->deleteKey("a"));
  CHECK(s->numKeys() == 1);
  s->set("", "empty key");
  CHECK(s->get("", 1s) == "empty key");
}

TEMPLATE_TEST_CASE("store: get waits for another client's set", "[store]", MemoryFixture,
                   TcpFixture, EtcdFixture) {
  TestType fx;
  auto reader = fx.client();
  auto writer = fx.client();
  auto value = later([&] { return reader->get("late", 10s); });
  REQUIRE(value.wait_for(50ms) == std::future_status::timeout);
  writer->set("late", "here");
  CHECK(value.get() == "here");
}

TEMPLATE_TEST_CASE("store: a timed-out call names the keys and leaves the store usable", "[store]",
                   MemoryFixture, TcpFixture) {
  TestType fx;
  auto s = fx.client();
  auto started = Clock::now();
  try {
    s->get("rdzv/job7/3/joined", 150ms);
    FAIL("get returned");
  } catch (const drun::TimeoutError& e) {
    std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("rdzv/job7/3/joined"));
    CHECK_THAT(what, Catch::Contains("150ms"));
  }
  CHECK(Clock::now() - started >= 150ms);
  CHECK(Clock::now() - started < 5s);
  s->set("after", "ok");
  CHECK(s->get("after", 1s) == "ok");
  s->set("x", "1");
  try {
    s->wait({"x", "y", "z"}, 50ms);
    FAIL("wait returned");
  } catch (const drun::TimeoutError& e) {
    std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("y") && Catch::Contains("z"));
    CHECK_THAT(what, !Catch::Contains("x,") && !Catch::Contains("[x"));
  }
  CHECK_THROWS_AS(s->get("never", 0ms), drun::TimeoutError);
  CHECK(s->numKeys() == 2);
}

TEMPLATE_TEST_CASE("store: add stores decimal ASCII", "[store]", MemoryFixture, TcpFixture, EtcdFixture) {
  TestType fx;
  auto s = fx.client();
  CHECK(s->add("n", 5) == 5);
  CHECK(s->add("n", -7) == -2);
  CHECK(s->get("n", 1s) == "-2");
  s->set("m", "40");
  CHECK(s->add("m", 2) == 42);
  CHECK(s->add("zero", 0) == 0);
  CHECK(s->tryGet("zero") == std::optional<Bytes>("0"));
  s->set("text", "abc");
  CHECK_THROWS_AS(s->add("text", 1), drun::InvalidArgument);
  s->set("big", std::to_string(INT64_MAX));
  CHECK_THROWS_AS(s->add("big", 1), drun::InvalidArgument);
  CHECK(s->add("n", 1) == -1);  // still usable after a refused call
}

TEMPLATE_TEST_CASE("store: compareSet follows torch TCPStore", "[store]", MemoryFixture,
                   TcpFixture, EtcdFixture) {
  TestType fx;
  auto s = fx.client();
  // Missing key, non-empty expected: nothing stored, `expected` returned.
  CHECK(s->compareSet("k", "old", "new") == "old");
  CHECK_FALSE(s->tryGet("k"));
  // Missing key, empty expected: stored.
  CHECK(s->compareSet("k", "", "v1") == "v1");
  CHECK(s->tryGet("k") == std::optional<Bytes>("v1"));
  // Existing key, wrong expected: current value returned, nothing changed.
  CHECK(s->compareSet("k", "nope", "v2") == "v1");
  CHECK(s->tryGet("k") == std::optional<Bytes>("v1"));
  // Existing key equal to expected: swapped.
  CHECK(s->compareSet("k", "v1", "v2") == "v2");
  CHECK(s->tryGet("k") == std::optional<Bytes>("v2"));
}

TEMPLATE_TEST_CASE("store: wait wakes on every kind of write", "[store]", MemoryFixture,
                   TcpFixture, EtcdFixture) {
  TestType fx;
  auto waiter = fx.client();
  auto writer = fx.client();
  using Write = std::function<void(Store&)>;
  std::vector<std::pair<std::string, Write>> writes = {
      {"set", [](Store& s) { s.set("w", "1"); }},
      {"add", [](Store& s) { s.add("w", 1); }},
      {"compareSet", [](Store& s) { s.compareSet("w", "", "1"); }},
      {"append", [](Store& s) { s.append("w", "1"); }},
      {"multiSet", [](Store& s) { s.multiSet({"other", "w"}, {"o", "1"}); }},
  };
  for (auto& [name, write] : writes) {
    INFO(name);
    writer->deleteKey("w");
    auto done = later([&] { waiter->wait({"w"}, 10s); });
    REQUIRE(done.wait_for(30ms) == std::future_status::timeout);
    write(*writer);
    REQUIRE(done.wait_for(5s) == std::future_status::ready);
    done.get();
  }
  // Several keys: returns only once all exist.
  auto all = later([&] { waiter->wait({"p", "q", "r"}, 10s); });
  writer->set("p", "1");
  writer->set("q", "1");
  REQUIRE(all.wait_for(30ms) == std::future_status::timeout);
  writer->set("r", "1");
  REQUIRE(all.wait_for(5s) == std::future_status::ready);
  all.get();
  waiter->wait({"p", "q", "r"}, 0ms);  // already there: no waiting, no timeout
}

TEMPLATE_TEST_CASE("store: multiGet and multiSet", "[store]", MemoryFixture, TcpFixture, EtcdFixture) {
  TestType fx;
  auto s = fx.client();
  auto other = fx.client();
  s->multiSet({"a", "b", "c"}, {"1", "2", "3"});
  CHECK(s->multiGet({"c", "a", "b"}, 1s) == std::vector<Bytes>{"3", "1", "2"});
  CHECK(s->multiGet({}, 1s).empty());
  auto pending = later([&] { return s->multiGet({"a", "d"}, 10s); });
  REQUIRE(pending.wait_for(30ms) == std::future_status::timeout);
  other->set("d", "4");
  CHECK(pending.get() == std::vector<Bytes>{"1", "4"});
  CHECK_THROWS_AS(s->multiSet({"x"}, {}), drun::InvalidArgument);
  CHECK_THROWS_AS(s->multiGet({"a", "missing"}, 20ms), drun::TimeoutError);
}

TEMPLATE_TEST_CASE("store: append creates and extends", "[store]", MemoryFixture, TcpFixture, EtcdFixture) {
  TestType fx;
  auto s = fx.client();
  s->append("log", "a");
  s->append("log", "bc");
  s->append("log", "");
  CHECK(s->get("log", 1s) == "abc");
}

TEMPLATE_TEST_CASE("store: watch wakes when the value differs", "[store]", MemoryFixture,
                   TcpFixture, EtcdFixture) {
  TestType fx;
  auto watcher = fx.client();
  auto writer = fx.client();
  // Already different: answers at once.
  CHECK(watcher->watch("v", std::string("x"), 1s) == std::nullopt);
  writer->set("v", "1");
  CHECK(watcher->watch("v", std::nullopt, 1s) == std::optional<Bytes>("1"));
  CHECK(watcher->watch("v", std::string("0"), 1s) == std::optional<Bytes>("1"));

  // Same value rewritten: not a change. A different one: wakes.
  auto changed = later([&] { return watcher->watch("v", std::string("1"), 10s); });
  REQUIRE(changed.wait_for(30ms) == std::future_status::timeout);
  writer->set("v", "1");
  REQUIRE(changed.wait_for(50ms) == std::future_status::timeout);
  writer->set("v", "2");
  CHECK(changed.get() == std::optional<Bytes>("2"));

  // Deletion is a change to "absent"; so is creation from absent.
  auto deleted = later([&] { return watcher->watch("v", std::string("2"), 10s); });
  REQUIRE(deleted.wait_for(30ms) == std::future_status::timeout);
  writer->deleteKey("v");
  CHECK(deleted.get() == std::nullopt);
  auto created = later([&] { return watcher->watch("v", std::nullopt, 10s); });
  REQUIRE(created.wait_for(30ms) == std::future_status::timeout);
  writer->add("v", 3);
  CHECK(created.get() == std::optional<Bytes>("3"));

  CHECK_THROWS_AS(watcher->watch("v", std::string("3"), 50ms), drun::TimeoutError);
  CHECK(watcher->tryGet("v") == std::optional<Bytes>("3"));
}

TEMPLATE_TEST_CASE("store: a client's will runs when it goes away", "[store]", MemoryFixture,
                   TcpFixture, EtcdFixture) {
  TestType fx;
  auto observer = fx.client();
  observer->set("job/alive/1", "yes");
  observer->add("job/members", 2);
  auto dying = fx.client();
  Store::Will will;
  will.sets = {{"job/left", "node1"}};
  will.adds = {{"job/members", -1}};
  will.deletes = {"job/alive/1"};
  dying->setWill(will);
  Store::Will replaced = will;
  replaced.sets = {{"job/left", "node1-final"}};
  dying->setWill(replaced);  // replaces the earlier one

  auto woken = later([&] { return observer->get("job/left", 10s); });
  auto aliveGone = later([&] { return observer->watch("job/alive/1", std::string("yes"), 10s); });
  REQUIRE(woken.wait_for(30ms) == std::future_status::timeout);
  dying.reset();
  CHECK(woken.get() == "node1-final");
  CHECK(aliveGone.get() == std::nullopt);
  CHECK(observer->get("job/members", 1s) == "1");
}

TEMPLATE_TEST_CASE("store: a key created and deleted in one will does not satisfy a get",
                   "[store]", MemoryFixture, TcpFixture, EtcdFixture) {
  TestType fx;
  auto observer = fx.client();
  auto dying = fx.client();
  Store::Will will;
  will.sets = {{"flicker", "1"}, {"after", "1"}};
  will.deletes = {"flicker"};
  dying->setWill(will);
  auto flicker = later([&] {
    try {
      observer->get("flicker", 300ms);
      return std::string("returned");
    } catch (const drun::TimeoutError&) {
      return std::string("timed out");
    }
  });
  auto other = fx.client();
  auto after = later([&] { return other->get("after", 10s); });
  REQUIRE(flicker.wait_for(30ms) == std::future_status::timeout);
  dying.reset();
  CHECK(after.get() == "1");
  CHECK(flicker.get() == "timed out");
}

TEMPLATE_TEST_CASE("store: an empty will clears the will", "[store]", MemoryFixture, TcpFixture, EtcdFixture) {
  TestType fx;
  auto observer = fx.client();
  auto c = fx.client();
  Store::Will will;
  will.sets = {{"gone", "1"}};
  c->setWill(will);
  c->setWill({});
  c.reset();
  // A marker written after the close proves the will (which would come first) did not run.
  auto probe = fx.client();
  probe->set("marker", "1");
  CHECK(observer->get("marker", 1s) == "1");
  CHECK_FALSE(observer->tryGet("gone"));
}

TEMPLATE_TEST_CASE("store: deletePrefix removes one job's keys", "[store]", MemoryFixture,
                   TcpFixture, EtcdFixture) {
  TestType fx;
  auto s = fx.client();
  s->multiSet({"rdzv/job1/a", "rdzv/job1/b/c", "rdzv/job10/a", "rdzv/job2/a"}, {"1", "2", "3", "4"});
  auto watcher = fx.client();
  auto gone = later([&] { return watcher->watch("rdzv/job1/a", std::string("1"), 10s); });
  REQUIRE(gone.wait_for(30ms) == std::future_status::timeout);
  CHECK(s->deletePrefix("rdzv/job1/") == 2);
  CHECK(gone.get() == std::nullopt);
  CHECK(s->numKeys() == 2);
  CHECK(s->tryGet("rdzv/job10/a"));
  CHECK(s->deletePrefix("rdzv/none/") == 0);
  CHECK_THROWS_AS(s->deletePrefix(""), drun::InvalidArgument);
}

TEMPLATE_TEST_CASE("store: inputs over the limits are refused, the store stays usable", "[store]",
                   MemoryFixture, TcpFixture) {
  TestType fx;
  auto s = fx.client();
  std::string longKey(kStoreLimits.maxKeyBytes + 1, 'k');
  CHECK_THROWS_AS(s->set(longKey, "v"), drun::InvalidArgument);
  CHECK_THROWS_AS(s->get(longKey, 10ms), drun::InvalidArgument);
  CHECK_THROWS_AS(s->set("k", Bytes(kStoreLimits.maxValueBytes + 1, 'v')), drun::InvalidArgument);
  s->set("k", Bytes(kStoreLimits.maxValueBytes - 1, 'v'));
  CHECK_THROWS_AS(s->append("k", "vv"), drun::InvalidArgument);
  CHECK(s->get("k", 5s).size() == kStoreLimits.maxValueBytes - 1);
  s->set("small", "1");
  CHECK(s->get("small", 1s) == "1");
}

TEMPLATE_TEST_CASE("store: concurrent adds from many threads and clients", "[store]",
                   MemoryFixture, TcpFixture, EtcdFixture) {
  TestType fx;
  constexpr int kClients = 4, kThreadsPerClient = 2, kAdds = 200;
  std::vector<std::unique_ptr<LivenessStore>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(fx.client());
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c)
    for (int t = 0; t < kThreadsPerClient; ++t)
      threads.emplace_back([&, c] {
        for (int i = 0; i < kAdds; ++i) clients[c]->add("counter", 1);
      });
  for (auto& t : threads) t.join();
  CHECK(clients[0]->get("counter", 1s) == std::to_string(kClients * kThreadsPerClient * kAdds));
}

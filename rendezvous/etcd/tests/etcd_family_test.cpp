// EtcdStore's keys as families of etcd keys (etcd_keyspace.hpp), against a real 3-member etcd
// cluster (skipped where etcd is not installed): adds of +-1 and appends from many clients at
// once keep the Store contract (a distinct total per add, every append once), and so do the
// reads, watches, compareSets, deletes and wills that meet such keys.
#include <catch2/catch.hpp>

#include <algorithm>
#include <future>
#include <set>
#include <sstream>

#include "drun/common/error.hpp"
#include "drun/etcd/etcd_store.hpp"
#include "drun/store/store_batch.hpp"
#include "etcd_test_options.hpp"
#include "thread_checks.hpp"

using namespace drun;
using namespace drun::rdzv;
using namespace std::chrono_literals;
using drun::test::etcdStoreOptions;

namespace {

constexpr int kClients = 12;

// Runs body(client index, its own store) on kClients threads at once (one session each, as
// separate agents) and returns what each returned. The bodies assert with the T_ macros
// (thread_checks.hpp: Catch2 is not thread-safe); their failures are reported here.
template <class Body>
auto onClients(const drun::test::EtcdCluster& cluster, Body body) {
  drun::test::ThreadChecks checks;
  std::vector<std::future<decltype(body(0, std::declval<EtcdStore&>()))>> futures;
  for (int c = 0; c < kClients; ++c)
    futures.push_back(std::async(std::launch::async, [&cluster, &checks, body, c] {
      drun::test::ThreadChecks::Scope scope(checks, "client " + std::to_string(c));
      EtcdStore store(openEtcdSession(etcdStoreOptions(cluster)));
      return body(c, store);
    }));
  for (auto& f : futures) f.wait();
  checks.report();
  std::vector<decltype(body(0, std::declval<EtcdStore&>()))> results;
  for (auto& f : futures) results.push_back(f.get());
  return results;
}

}  // namespace

TEST_CASE("etcd store: concurrent adds give each caller its own total and lose none", "[etcd]") {
  drun::test::EtcdCluster cluster;
  EtcdStore s(openEtcdSession(etcdStoreOptions(cluster)));
  constexpr int kAdds = 20;
  const auto totals = onClients(cluster, [](int, EtcdStore& mine) {
    std::vector<int64_t> seen;
    for (int i = 0; i < kAdds; ++i) {
      seen.push_back(mine.add("count", 1));
      mine.add("present", i % 2 ? -1 : 1);
    }
    return seen;
  });
  std::set<int64_t> distinct;
  for (const auto& seen : totals) {
    CHECK(std::is_sorted(seen.begin(), seen.end()));  // one client's totals only grow
    distinct.insert(seen.begin(), seen.end());
  }
  CHECK(distinct.size() == size_t(kClients * kAdds));
  CHECK(*distinct.begin() == 1);
  CHECK(*distinct.rbegin() == kClients * kAdds);
  CHECK(s.tryGet("count") == std::optional<Bytes>(std::to_string(kClients * kAdds)));
  CHECK(s.get("present", 1s) == "0");
  // Other deltas and sets meet the counters: a set value is the base, a text stops adds.
  CHECK(s.add("count", 10) == kClients * kAdds + 10);
  CHECK(s.add("count", -1) == kClients * kAdds + 9);
  s.set("count", "7");
  CHECK(s.add("count", 1) == 8);
  s.set("count", "closed");
  CHECK_THROWS_AS(s.add("count", 1), InvalidArgument);
  CHECK(s.tryGet("count") == std::optional<Bytes>("closed"));
  CHECK(s.add("fresh", 0) == 0);
  CHECK_THROWS_AS(s.add(std::string("nul\0key", 7), 1), InvalidArgument);
}

TEST_CASE("etcd store: concurrent appends each appear once, in each writer's order", "[etcd]") {
  drun::test::EtcdCluster cluster;
  EtcdStore s(openEtcdSession(etcdStoreOptions(cluster)));
  s.set("joined", "head\n");
  constexpr int kAppends = 15;
  onClients(cluster, [](int c, EtcdStore& mine) {
    for (int i = 0; i < kAppends; ++i) mine.append("joined", std::to_string(c) + " " + std::to_string(i) + "\n");
    return 0;
  });
  std::istringstream lines(s.get("joined", 1s));
  std::string line;
  REQUIRE(std::getline(lines, line));
  CHECK(line == "head");
  std::vector<int> next(kClients, 0);
  int count = 0;
  while (std::getline(lines, line)) {
    int c = -1, i = -1;
    std::istringstream(line) >> c >> i;
    REQUIRE((c >= 0 && c < kClients));
    CHECK(i == next[c]);  // once each, in its writer's order
    next[c] = i + 1;
    ++count;
  }
  CHECK(count == kClients * kAppends);
  // A set replaces the appended value; appends extend it; multiGet reads families.
  s.set("joined", "new");
  s.append("joined", "+1");
  s.add("n", 1);
  CHECK(s.multiGet({"joined", "n"}, 1s) == std::vector<Bytes>{"new+1", "1"});
  CHECK(s.numKeys() == 2);  // Store keys, not etcd keys
  CHECK(s.compareSet("joined", "new", "x") == "new+1");
  CHECK(s.compareSet("joined", "new+1", "x") == "x");
  CHECK(s.compareSet("n", "1", "done") == "done");
  CHECK(s.get("n", 1s) == "done");
  CHECK(s.deleteKey("joined"));
  CHECK_FALSE(s.tryGet("joined"));
  s.append("joined", "again");
  CHECK(s.get("joined", 1s) == "again");
  s.add("n2", 1);
  CHECK(s.deletePrefix("n") == 2);
  CHECK(s.numKeys() == 1);
}

TEST_CASE("etcd store: watch and get follow a counter and an appended key", "[etcd]") {
  drun::test::EtcdCluster cluster;
  auto session = openEtcdSession(etcdStoreOptions(cluster));
  EtcdStore s(session);
  EtcdStore other(session);
  CHECK(s.add("c", 1) == 1);
  auto adder = std::async(std::launch::async, [&] { return other.add("c", 1); });
  CHECK(s.watch("c", std::optional<Bytes>("1"), 5s) == std::optional<Bytes>("2"));
  CHECK(adder.get() == 2);
  auto appender = std::async(std::launch::async, [&] { other.append("a", "x"); });
  CHECK(s.get("a", 5s) == "x");
  appender.get();
  auto remover = std::async(std::launch::async, [&] { other.deleteKey("c"); });
  CHECK_FALSE(s.watch("c", std::optional<Bytes>("2"), 5s).has_value());
  remover.get();
}

TEST_CASE("etcd store: wills add to counters that other agents add to at the same time", "[etcd]") {
  drun::test::EtcdCluster cluster;
  EtcdStore observer(openEtcdSession(etcdStoreOptions(cluster)));
  observer.set("status", "0");
  constexpr int kAdds = 10;
  // Each client leaves (its store closes) right after its adds: its will adds 1 to `left` and
  // `status`, -1 to `present`, while the others still add to them.
  onClients(cluster, [](int, EtcdStore& mine) {
    mine.add("present", 1);
    mine.setWill({{}, {{"left", 1}, {"present", -1}, {"status", 1}, {"status", 1}}, {}});
    for (int i = 0; i < kAdds; ++i) mine.add("left", 1);
    return 0;
  });
  CHECK(observer.tryGet("left") == std::optional<Bytes>(std::to_string(kClients * (kAdds + 1))));
  CHECK(observer.tryGet("present") == std::optional<Bytes>("0"));
  CHECK(observer.tryGet("status") == std::optional<Bytes>(std::to_string(2 * kClients)));
  // A decided status (a text) is skipped by a will, as by a store server.
  observer.set("status", "decided");
  {
    EtcdStore last(openEtcdSession(etcdStoreOptions(cluster)));
    last.setWill({{{"gone", "1"}}, {{"status", 1}, {"gone", 1}}, {"left"}});
  }
  CHECK(observer.tryGet("status") == std::optional<Bytes>("decided"));
  CHECK(observer.tryGet("gone") == std::optional<Bytes>("2"));
  CHECK_FALSE(observer.tryGet("left"));
}

TEST_CASE("etcd store: a batch's will and the +-1 add right after it count a node in and out "
          "together", "[etcd]") {
  // RoundJoin's batch: setWill(..., present -1), add(present, 1). EtcdStore::runBatch makes the
  // two one transaction, so a lease that ends between them cannot leave the +1 without the will
  // that takes it back (a node counted in for good), nor the will without the +1.
  drun::test::EtcdCluster cluster;
  auto observerSession = openEtcdSession(etcdStoreOptions(cluster));
  EtcdStore observer(observerSession);
  observer.setWill({{}, {{"observer.alive", 1}}, {}});  // it runs the will executor too
  const auto totals = onClients(cluster, [](int c, EtcdStore& mine) {
    StoreBatch batch;
    const size_t will = batch.setWill({{{"dead/" + std::to_string(c), "1"}}, {{"present", -1}}, {}});
    const size_t in = batch.add("present", 1);
    const size_t joined = batch.append("joined", std::to_string(c) + "\n");
    mine.runBatch(batch);
    T_CHECK(batch.ok(will));
    T_CHECK(batch.ok(joined));
    const int64_t total = batch.number(in);
    if (c % 2) endLeaseForTest(mine.session());  // dies: the others apply its will
    return total;                                 // (the others close cleanly: their own)
  });
  for (int64_t total : totals) {  // (wills of the dead already taking theirs back meanwhile)
    CHECK(total >= 1);
    CHECK(total <= kClients);
  }
  // Every will ran (its sets and adds are one transaction), each taking back its +1.
  for (int c = 0; c < kClients; ++c)
    CHECK(observer.get("dead/" + std::to_string(c), 10s) == "1");
  CHECK(observer.tryGet("present") == std::optional<Bytes>("0"));
}

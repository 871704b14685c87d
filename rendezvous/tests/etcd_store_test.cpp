// The etcd client and EtcdStore against a real 3-member etcd cluster (scripts/etcd/up.sh; the
// tests skip where etcd is not installed), and the c10d rendezvous on it.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <thread>

#include "c10d_test_support.hpp"
#include "drun/common/error.hpp"
#include "drun/rendezvous/c10d_rendezvous.hpp"
#include "drun/etcd/etcd_client.hpp"
#include "drun/etcd/etcd_store.hpp"
#include "drun/rendezvous/keys.hpp"
#include "etcd_cluster.hpp"
#include "etcd_test_options.hpp"

using namespace drun;
using namespace drun::rdzv;
using namespace std::chrono_literals;

namespace {

EtcdClientOptions clientOptions(const std::vector<std::string>& endpoints) {
  return ::drun::test::etcdClientOptions(endpoints);
}

EtcdStoreOptions storeOptions(const ::drun::test::EtcdCluster& cluster, const std::string& scope = "job") {
  return ::drun::test::etcdStoreOptions(cluster, scope);
}

// Agents of the c10d rendezvous on EtcdStores of one cluster, one session (lease) each.
struct EtcdRdzvCluster {
  ::drun::test::EtcdCluster etcd;
  std::shared_ptr<EtcdSession> observerSession = openEtcdSession(storeOptions(etcd));
  EtcdStore observer{observerSession};

  std::unique_ptr<Rendezvous> agent(const RendezvousOptions& o) {
    auto session = openEtcdSession(storeOptions(etcd));
    C10dStoreAccess access;
    access.store = std::make_unique<EtcdStore>(session);
    access.connectWatcher = [session] { return std::make_unique<EtcdStore>(session); };
    access.endpoint = "etcd " + etcd.list();
    return makeC10dRendezvous(o, std::move(access));
  }
  LivenessStore& store() { return observer; }
};

}  // namespace

TEST_CASE("etcd client: put, range, txn, deleterange on a real cluster", "[etcd]") {
  ::drun::test::EtcdCluster cluster;
  EtcdClient c(clientOptions(cluster.endpoints()));
  const std::string binary("a\0b\xff", 4);  // values are bytes
  CHECK(c.put("/c/k", binary) > 0);
  EtcdRange r = c.range("/c/k");
  REQUIRE(r.kvs.size() == 1);
  CHECK(r.kvs[0].value == binary);
  CHECK(r.kvs[0].version == 1);
  c.put("/c/empty", "");  // an empty value arrives as an omitted field
  REQUIRE(c.range("/c/empty").kvs.size() == 1);
  CHECK(c.range("/c/empty").kvs[0].value.empty());
  CHECK(c.range("/c/", EtcdClient::prefixEnd("/c/"), true).count == 2);
  // A txn: compare on the value; the failure branch reads (false booleans are omitted).
  EtcdTxnResult t = c.txn({{"/c/k", EtcdCompare::Target::Value, "other", 0}},
                          {EtcdOp::put("/c/k", "x")}, {EtcdOp::range("/c/k")}, true);
  CHECK_FALSE(t.succeeded);
  REQUIRE(t.ranges.size() == 1);
  CHECK(t.ranges[0].kvs[0].value == binary);
  t = c.txn({{"/c/absent", EtcdCompare::Target::CreateRevision, {}, 0}},
            {EtcdOp::put("/c/absent", "y")}, {}, true);
  CHECK(t.succeeded);
  CHECK(c.deleteRange("/c/", EtcdClient::prefixEnd("/c/")) == 3);
  CHECK(c.range("/c/k").kvs.empty());
}

// Two clusters on the same ports (tests run side by side, two checkouts' suites at once): the
// second's members cannot bind and exit, and the first's answer the second's health checks. up.sh
// must fail (EtcdCluster then tries other ports), not hand its test the other cluster, whose
// owner would stop it under that test (a NetworkError in the middle of an interleaving run).
TEST_CASE("etcd up.sh: a cluster on the ports of a running one fails instead of reporting the other's members", "[etcd]") {
  ::drun::test::EtcdCluster first;
  const std::string& endpoint = first.endpoints()[0];
  const int base = std::stoi(endpoint.substr(endpoint.rfind(':') + 1));
  const std::string dir = "/tmp/drun-etcd-up-test-" + std::to_string(::getpid());
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system(("BASE_PORT=" + std::to_string(base) + " " + DRUN_SOURCE_DIR +
                                  "/scripts/etcd/up.sh " + dir + " >/dev/null 2>&1").c_str());
  CHECK(status != 0);
  CHECK(std::chrono::steady_clock::now() - t0 < 15s);  // its members' exit is seen, not waited out
  (void)std::system((std::string(DRUN_SOURCE_DIR) + "/scripts/etcd/down.sh " + dir + " >/dev/null 2>&1").c_str());
  EtcdClient c(clientOptions(first.endpoints()));  // the first cluster is untouched
  CHECK(c.put("/up/k", "v") > 0);
  CHECK(c.range("/up/k").kvs.size() == 1);
}

TEST_CASE("etcd client: a lease not kept alive ends and takes its keys", "[etcd]") {
  ::drun::test::EtcdCluster cluster;
  EtcdClient c(clientOptions(cluster.endpoints()));
  std::chrono::seconds granted{0};
  const int64_t lease = c.leaseGrant(2s, &granted);
  CHECK(granted >= 1s);
  c.put("/l/k", "v", lease);
  CHECK(c.leaseKeepAlive(lease, Deadline(2s)) > 0);
  CHECK(c.leaseTimeToLive(lease) > 0);
  // The key's deletion comes through a watch once the TTL passed.
  const auto start = Clock::now();
  bool deleted = false;
  c.watch("/l/k", {}, c.range("/l/k").revision + 1, Deadline(granted + 5s),
          [&](const std::vector<EtcdWatchEvent>& events) {
            for (const auto& e : events) deleted = deleted || e.deleted;
            return !deleted;
          });
  CHECK(deleted);
  CHECK(Clock::now() - start < granted + 4s);
  CHECK(c.leaseTimeToLive(lease) == -1);
  CHECK(c.leaseKeepAlive(lease, Deadline(2s)) == 0);
}

TEST_CASE("etcd client: a watch sees puts and deletes in order, and times out at its deadline",
          "[etcd]") {
  ::drun::test::EtcdCluster cluster;
  EtcdClient c(clientOptions(cluster.endpoints()));
  EtcdClient writer(clientOptions(cluster.endpoints()));
  const int64_t from = c.range("/w/").revision + 1;
  auto writes = std::async(std::launch::async, [&] {
    writer.put("/w/a", "1");
    writer.put("/w/b", "2");
    writer.deleteRange("/w/a");
  });
  std::vector<std::string> seen;
  c.watch("/w/", EtcdClient::prefixEnd("/w/"), from, Deadline(10s),
          [&](const std::vector<EtcdWatchEvent>& events) {
            for (const auto& e : events) seen.push_back((e.deleted ? "-" : "+") + e.kv.key);
            return seen.size() < 3;
          });
  writes.get();
  CHECK(seen == std::vector<std::string>{"+/w/a", "+/w/b", "-/w/a"});
  const auto start = Clock::now();
  CHECK_THROWS_AS(c.watch("/w/none", {}, 0, Deadline(300ms), [](const auto&) { return true; }),
                  TimeoutError);
  CHECK(Clock::now() - start < 3s);
}

TEST_CASE("etcd client: calls and watches fail over when the member in use is killed", "[etcd]") {
  ::drun::test::EtcdCluster cluster;
  EtcdClient c(clientOptions(cluster.endpoints()));
  // The watch starts after "1" whenever its thread gets to run: it read the revision itself once,
  // and under load that read came after the puts below, so it waited for a "3" already past.
  const int64_t afterFirst = c.put("/f/k", "1") + 1;
  auto watched = std::async(std::launch::async, [&] {
    EtcdClient w(clientOptions(cluster.endpoints()));
    std::string value;
    w.watch("/f/k", {}, afterFirst, Deadline(15s),
            [&](const std::vector<EtcdWatchEvent>& events) {
              value = events.back().kv.value;
              return value != "3";
            });
    return value;
  });
  // The member this client talks to (each client starts on a random one).
  const auto& all = cluster.endpoints();
  const int used = int(std::find(all.begin(), all.end(), c.endpointName()) - all.begin());
  REQUIRE(used < 3);
  cluster.kill(used);
  const auto start = Clock::now();
  c.put("/f/k", "2");
  c.put("/f/k", "3");
  CHECK(Clock::now() - start < 8s);
  CHECK(c.range("/f/k").kvs.at(0).value == "3");
  REQUIRE(watched.wait_for(20s) == std::future_status::ready);
  CHECK(watched.get() == "3");
  cluster.killAll();
  CHECK_THROWS_AS(c.put("/f/k", "4"), NetworkError);
}

TEST_CASE("etcd store: the Store contract over etcd", "[etcd]") {
  ::drun::test::EtcdCluster cluster;
  auto session = openEtcdSession(storeOptions(cluster));
  EtcdStore s(session);
  EtcdStore other(session);
  CHECK(s.numKeys() == 0);
  CHECK_FALSE(s.tryGet("a"));
  s.set("a", "1");
  CHECK(s.get("a", 1s) == "1");
  CHECK(s.check({"a"}));
  CHECK_FALSE(s.check({"a", "b"}));
  CHECK(s.add("n", 5) == 5);
  CHECK(s.add("n", -2) == 3);
  s.set("text", "x");
  CHECK_THROWS_AS(s.add("text", 1), InvalidArgument);
  // compareSet, torch's semantics.
  CHECK(s.compareSet("cs", "", "v1") == "v1");
  CHECK(s.compareSet("cs", "", "v2") == "v1");
  CHECK(s.compareSet("cs", "v1", "v2") == "v2");
  CHECK(s.compareSet("missing", "x", "y") == "x");
  CHECK_FALSE(s.tryGet("missing"));
  s.set("emptyv", "");
  CHECK(s.compareSet("emptyv", "", "filled") == "filled");
  s.append("ap", "x");
  s.append("ap", "y");
  CHECK(s.tryGet("ap") == std::optional<Bytes>("xy"));
  s.multiSet({"m1", "m2", "m1"}, {"a", "b", "c"});
  CHECK(s.multiGet({"m1", "m2"}, 1s) == std::vector<Bytes>{"c", "b"});
  // Blocking calls: woken by another client's write; a deadline names the key.
  auto later = std::async(std::launch::async, [&] { other.set("late", "here"); });
  CHECK(s.get("late", 5s) == "here");
  later.get();
  CHECK(s.watch("late", std::optional<Bytes>("old"), 1s) == std::optional<Bytes>("here"));
  auto deleter = std::async(std::launch::async, [&] { other.deleteKey("late"); });
  CHECK_FALSE(s.watch("late", std::optional<Bytes>("here"), 5s).has_value());
  deleter.get();
  try {
    s.wait({"never"}, 200ms);
    FAIL("no timeout");
  } catch (const TimeoutError& e) {
    CHECK_THAT(e.what(), Catch::Contains("never"));
  }
  // Concurrent adds from several threads: none lost.
  std::vector<std::future<void>> adders;
  for (int t = 0; t < 4; ++t)
    adders.push_back(std::async(std::launch::async, [&] {
      EtcdStore mine(session);
      for (int i = 0; i < 10; ++i) mine.add("counter", 1);
    }));
  for (auto& f : adders) f.get();
  CHECK(s.tryGet("counter") == std::optional<Bytes>("40"));
  CHECK(s.deletePrefix("m") == 2);
  CHECK_FALSE(s.tryGet("m1"));
}

TEST_CASE("etcd store: a will runs at a clean close, and when a cut-off agent's lease ends",
          "[etcd]") {
  ::drun::test::EtcdCluster cluster;
  auto observerSession = openEtcdSession(storeOptions(cluster));
  EtcdStore observer(observerSession);
  observer.setWill({{}, {{"observer.alive", 1}}, {}});  // it runs the will executor too
  {
    EtcdStore clean(openEtcdSession(storeOptions(cluster)));
    clean.set("status", "0");
    clean.setWill({{{"dead/clean", "1"}}, {{"status", 1}, {"gone", 1}}, {}});
  }
  CHECK(observer.tryGet("dead/clean") == std::optional<Bytes>("1"));
  CHECK(observer.tryGet("status") == std::optional<Bytes>("1"));

  auto cutSession = openEtcdSession(storeOptions(cluster));
  auto cut = std::make_unique<EtcdStore>(cutSession);
  cut->setWill({{{"dead/cut", "1"}}, {{"gone", 1}, {"status", 1}}, {}});
  stopKeepAliveForTest(*cutSession);
  const auto start = Clock::now();
  // The survivors see the will within the lease's TTL (plus etcd's expiry check).
  CHECK(observer.watch("dead/cut", std::nullopt, etcdSessionTtl(*cutSession) + 5s) ==
        std::optional<Bytes>("1"));
  CHECK(Clock::now() - start < etcdSessionTtl(*cutSession) + 4s);
  CHECK(observer.tryGet("gone") == std::optional<Bytes>("2"));
  CHECK(observer.tryGet("status") == std::optional<Bytes>("2"));
  // The cut-off agent knows it: its calls fail, naming the lease.
  REQUIRE(etcdSessionLost(*cutSession));
  CHECK_THROWS_WITH(cut->tryGet("gone"), Catch::Contains("lease"));
  cut.reset();  // no second application
  CHECK(observer.tryGet("gone") == std::optional<Bytes>("2"));
}

TEST_CASE("etcd store: a session that replaces a lost one applies the lost one's will first",
          "[etcd]") {
  // No other session holds a will here, so no executor applies the lost session's will: only
  // the replacement can, and it must, before its agent does anything on the new session. (The
  // interleavings over etcd, under load: a node cut off while it joined came back on a new
  // session and joined the same round again before the others applied its will, which then
  // counted a running member gone.)
  ::drun::test::EtcdCluster cluster;
  const EtcdStoreOptions options = storeOptions(cluster);
  auto lost = openEtcdSession(options);
  auto cut = std::make_unique<EtcdStore>(lost);
  cut->set("status", "0");
  cut->setWill({{{"dead/n0", "1"}}, {{"left", 1}, {"status", 1}}, {}});
  stopKeepAliveForTest(*lost);
  const auto until = Clock::now() + etcdSessionTtl(*lost) + 10s;
  while (!etcdSessionLost(*lost) && Clock::now() < until) std::this_thread::sleep_for(20ms);
  REQUIRE(etcdSessionLost(*lost));
  cut.reset();  // closing on a lost session applies nothing (etcd ends the lease)

  auto next = replaceLostEtcdSession(options, *lost);
  REQUIRE_FALSE(etcdSessionLost(*next));
  EtcdStore store(next);
  CHECK(store.tryGet("dead/n0") == std::optional<Bytes>("1"));
  CHECK(store.tryGet("left") == std::optional<Bytes>("1"));
  CHECK(store.tryGet("status") == std::optional<Bytes>("1"));
  // Exactly once: a second replacement (or another session's executor) finds no record.
  auto third = replaceLostEtcdSession(options, *lost);
  CHECK(store.tryGet("left") == std::optional<Bytes>("1"));
}

TEST_CASE("etcd rendezvous: four agents form a round, and a dead agent is a lost member",
          "[etcd]") {
  using namespace drun::rdzv::test;
  EtcdRdzvCluster cluster;
  std::vector<std::unique_ptr<Rendezvous>> agents;
  for (const char* host : {"hostA", "hostB", "hostC"})
    agents.push_back(cluster.agent(withNode(options(3, 3), host, 2)));
  FirstChange change(*agents[0]);
  std::vector<std::future<RoundResult>> futures;
  for (auto& a : agents) futures.push_back(startNext(*a));
  std::vector<RoundResult> results;
  for (auto& f : futures) results.push_back(getWithin(f));
  checkRound(results, {2, 2, 2});
  agents[2].reset();  // closes without leave(): its will runs
  CHECK_THAT(change.get(), Catch::Contains("hostC") && Catch::Contains("left round 0"));
  agents[0]->leave();
  agents[1]->leave();
}

TEST_CASE("etcd client: user and password auth against a cluster with auth enabled", "[etcd]") {
  ::drun::test::EtcdCluster cluster;
  const std::string ctl = "ETCDCTL_API=3 etcdctl --endpoints=" + cluster.list() + " ";
  if (std::system((ctl + "version >/dev/null 2>&1").c_str()) != 0)
    ::drun::test::skipTest("etcdctl is not installed (Debian: etcd-client)");
  REQUIRE(std::system((ctl + "user add root:rootpw >/dev/null 2>&1").c_str()) == 0);
  REQUIRE(std::system((ctl + "auth enable >/dev/null 2>&1").c_str()) == 0);
  EtcdClientOptions o = clientOptions(cluster.endpoints());
  EtcdClient anonymous(o);
  CHECK_THROWS_AS(anonymous.put("/a/k", "v"), Error);
  o.user = "root";
  o.password = "rootpw";
  EtcdClient authenticated(o);
  authenticated.put("/a/k", "v");
  CHECK(authenticated.range("/a/k").kvs.at(0).value == "v");
  o.password = "wrong";
  EtcdClient wrong(o);
  CHECK_THROWS_AS(wrong.range("/a/k"), AuthError);
}

TEST_CASE("etcd client: https with etcd_cacert, and a certificate the CA does not vouch for is refused",
          "[etcd]") {
  ::drun::test::EtcdCluster cluster(/*tls=*/true);
  EtcdClientOptions o = clientOptions(cluster.endpoints());
  o.caFile = cluster.caFile();
  EtcdClient secure(o);
  secure.put("/tls/k", "v");
  CHECK(secure.range("/tls/k").kvs.at(0).value == "v");
  o.caFile = cluster.memberCertificate();  // not a CA: the members' certificates do not verify
  EtcdClient wrongCa(o);
  CHECK_THROWS_AS(wrongCa.range("/tls/k"), AuthError);
  EtcdClient plain(clientOptions(cluster.endpoints()));  // http to an https member
  CHECK_THROWS_AS(plain.range("/tls/k"), Error);
}

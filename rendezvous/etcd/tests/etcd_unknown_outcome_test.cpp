// EtcdStore's writes whose outcome is unknown (applied by etcd, the reply lost: a member killed
// between the two), made deterministic with a relay that drops one transaction's reply
// (etcd_reply_dropper.hpp) against a real cluster (skipped where etcd is not installed). The
// store retries them and each counts exactly once, returning what the applied attempt would
// have returned, even when another agent's add lands between the attempt and the retry.
#include <catch2/catch.hpp>

#include <atomic>

#include "drun/etcd/etcd_store.hpp"
#include "etcd_reply_dropper.hpp"
#include "etcd_test_options.hpp"

using namespace drun;
using namespace drun::rdzv;
using namespace std::chrono_literals;
using drun::test::etcdStoreOptions;

namespace {

// The retry tokens the stores of the cluster hold now (etcd_session.hpp: nextAppliedKey).
int64_t tokensHeld(const drun::test::EtcdCluster& cluster) {
  EtcdClient client(drun::test::etcdClientOptions(cluster.endpoints()));
  const std::string dir = etcdStoreOptions(cluster).prefix + "applied/";
  return client.range(dir, EtcdClient::prefixEnd(dir), true).count;
}

}  // namespace

TEST_CASE("etcd store: an add whose reply is lost after etcd applied it counts once, with its own total",
          "[etcd]") {
  drun::test::EtcdCluster cluster;
  drun::test::ReplyDropper relay(cluster.endpoints()[0]);
  EtcdStoreOptions viaRelay = etcdStoreOptions(cluster);
  viaRelay.client.endpoints = {relay.endpoint()};
  EtcdStore other(openEtcdSession(etcdStoreOptions(cluster)));
  {
    EtcdStore agent(openEtcdSession(viaRelay));

    // +1 (a put of the family's counter): the other agent's add lands before the retry; the
    // retry still answers 1, the total the applied attempt saw.
    // (Catch2 checks on this thread only: the hook, on the relay's, keeps what it saw.)
    std::atomic<int64_t> between{0};
    relay.dropNextTxnReply([&] { between = other.add("count", 1); });
    CHECK(agent.add("count", 1) == 1);
    CHECK(between == 2);
    CHECK(relay.dropped() == 1);
    CHECK(other.tryGet("count") == std::optional<Bytes>("2"));
    CHECK(agent.add("count", 1) == 3);

    // -1 likewise.
    relay.dropNextTxnReply([&] { between = other.add("count", -1); });
    CHECK(agent.add("count", -1) == 2);
    CHECK(between == 1);
    CHECK(other.tryGet("count") == std::optional<Bytes>("1"));

    // A delta other than +-1 rewrites K under a compare: applied once, though K changed since.
    relay.dropNextTxnReply([&] { between = other.add("sum", 1); });
    CHECK(agent.add("sum", 5) == 5);
    CHECK(between == 6);
    CHECK(other.tryGet("sum") == std::optional<Bytes>("6"));
    relay.dropNextTxnReply([] {});
    CHECK(agent.add("sum", 10) == 16);
    CHECK(other.tryGet("sum") == std::optional<Bytes>("16"));
    CHECK(relay.dropped() == 4);

    // The tokens that make the retries safe do not pile up: each add removes the last one's.
    for (int i = 0; i < 20; ++i) {
      agent.add("count", 1);
      other.add("count", 1);
    }
    CHECK(tokensHeld(cluster) <= 2);
  }
  // A closed store's last token goes with its lease.
  CHECK(tokensHeld(cluster) <= 1);
}

TEST_CASE("etcd store: a compareSet whose reply is lost after etcd applied it answers its own win",
          "[etcd]") {
  drun::test::EtcdCluster cluster;
  drun::test::ReplyDropper relay(cluster.endpoints()[0]);
  EtcdStoreOptions viaRelay = etcdStoreOptions(cluster);
  viaRelay.client.endpoints = {relay.endpoint()};
  EtcdStore other(openEtcdSession(etcdStoreOptions(cluster)));
  EtcdStore agent(openEtcdSession(viaRelay));

  // The agent wins "" -> mine; its reply is lost, and another writer replaces the value before
  // the retry. The agent won: the retry must say so (a fresh read would report "theirs", a loss
  // it never had, and the caller would act on another's decision).
  std::atomic<bool> replaced{false};
  relay.dropNextTxnReply([&] { replaced = other.compareSet("decision", "mine", "theirs") == "theirs"; });
  CHECK(agent.compareSet("decision", "", "mine") == "mine");
  CHECK(relay.dropped() == 1);
  CHECK(replaced);
  CHECK(other.tryGet("decision") == std::optional<Bytes>("theirs"));

  // A loss is still a loss: the value now stored.
  CHECK(agent.compareSet("decision", "", "again") == "theirs");
  // And a win with its reply lost and nobody in between: the win.
  relay.dropNextTxnReply([] {});
  CHECK(agent.compareSet("decision", "theirs", "last") == "last");
  CHECK(relay.dropped() == 2);
  CHECK(other.tryGet("decision") == std::optional<Bytes>("last"));
}

TEST_CASE("etcd store: a deleteKey whose reply is lost after etcd applied it says the key existed, "
          "and removes nothing written since",
          "[etcd]") {
  drun::test::EtcdCluster cluster;
  drun::test::ReplyDropper relay(cluster.endpoints()[0]);
  EtcdStoreOptions viaRelay = etcdStoreOptions(cluster);
  viaRelay.client.endpoints = {relay.endpoint()};
  EtcdStore other(openEtcdSession(etcdStoreOptions(cluster)));
  EtcdStore agent(openEtcdSession(viaRelay));

  other.set("k", "v1");
  relay.dropNextTxnReply([&] { other.set("k", "v2"); });
  CHECK(agent.deleteKey("k"));
  CHECK(relay.dropped() == 1);
  CHECK(other.tryGet("k") == std::optional<Bytes>("v2"));  // written after the delete: kept

  // The same for a prefix: the count of what the applied attempt removed.
  other.set("p/a", "1");
  other.set("p/b", "2");
  relay.dropNextTxnReply([&] { other.set("p/c", "3"); });
  CHECK(agent.deletePrefix("p/") == 2);
  CHECK(relay.dropped() == 2);
  CHECK(other.tryGet("p/c") == std::optional<Bytes>("3"));
  CHECK_FALSE(agent.deleteKey("missing"));
}

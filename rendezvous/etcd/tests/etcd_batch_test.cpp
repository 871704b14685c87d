// EtcdStore::runBatch (etcd_batch.cpp) against a real cluster (SKIPPED without etcd): a batch of
// independent calls is one etcd transaction (counted by a relay in front of the member) with
// each call's own result, also where one call's condition fails (a compareSet that loses, an
// add on a value that is no integer);
// a batch whose reply is lost after etcd applied it is applied once and answers what it saw.
#include <catch2/catch.hpp>

#include "drun/etcd/etcd_store.hpp"
#include "drun/store/store_batch.hpp"
#include "etcd_reply_dropper.hpp"
#include "etcd_test_options.hpp"

using namespace drun;
using namespace drun::rdzv;
using namespace std::chrono_literals;
using drun::test::etcdStoreOptions;

namespace {

struct RelayedStores {
  drun::test::EtcdCluster cluster;
  drun::test::ReplyDropper relay{cluster.endpoints()[0]};
  EtcdStore other{openEtcdSession(etcdStoreOptions(cluster))};
  EtcdStore agent{openEtcdSession([&] {
    EtcdStoreOptions o = etcdStoreOptions(cluster);
    o.client.endpoints = {relay.endpoint()};
    return o;
  }())};
  int kvCalls() {
    return relay.requests("/v3/kv/txn") + relay.requests("/v3/kv/range") + relay.requests("/v3/kv/put") +
           relay.requests("/v3/kv/deleterange");
  }
};

}  // namespace

TEST_CASE("etcd store: a batch of independent calls is one transaction, with each call's result",
          "[etcd][batch]") {
  RelayedStores s;
  for (const char* key : {"gone", "dir/a", "dir/b"}) s.other.set(key, "x");
  s.other.set("here", "v0");
  s.other.add("count", 1);
  StoreBatch batch;
  batch.set("k", "v");
  const size_t here = batch.tryGet("here");
  const size_t absent = batch.tryGet("absent");
  const size_t up = batch.add("count", 1);
  const size_t down = batch.add("down", -1);
  const size_t won = batch.compareSet("decision", "", "mine");
  batch.append("log", "line");
  Store::Will will;
  will.sets = {{"dead", "1"}};
  batch.setWill(will);
  const size_t existed = batch.deleteKey("gone");
  const size_t missing = batch.deleteKey("never");
  const size_t removed = batch.deletePrefix("dir/");
  // One transaction (call by call, that batch would be 8 of them). Only transactions are
  // counted here: the will starts the session's will executor, whose reads go through the relay.
  const int before = s.relay.requests("/v3/kv/txn");
  s.agent.runBatch(batch);
  CHECK(s.relay.requests("/v3/kv/txn") - before == 1);

  for (size_t i = 0; i < batch.size(); ++i) CHECK(batch.ok(i));
  CHECK(batch.value(here) == std::optional<Bytes>("v0"));
  CHECK(batch.value(absent) == std::nullopt);
  CHECK(batch.number(up) == 2);
  CHECK(batch.number(down) == -1);
  CHECK(batch.value(won) == std::optional<Bytes>("mine"));
  CHECK(batch.number(existed) == 1);
  CHECK(batch.number(missing) == 0);
  CHECK(batch.number(removed) == 2);
  CHECK(s.other.tryGet("k") == std::optional<Bytes>("v"));
  CHECK(s.other.tryGet("decision") == std::optional<Bytes>("mine"));
  CHECK(s.other.tryGet("log") == std::optional<Bytes>("line"));
  CHECK_FALSE(s.other.check({"gone"}));
  CHECK_FALSE(s.other.check({"dir/a"}));
  // The will is registered as setWill registers it: a clean close runs it.
  CHECK_FALSE(s.other.tryGet("dead"));
  StoreBatch clear;
  clear.setWill({});
  s.agent.runBatch(clear);
  CHECK(s.other.add("count", 1) == 3);
}

TEST_CASE("etcd store: a call of a batch whose condition fails holds no other back, and answers "
          "as its own call would",
          "[etcd][batch]") {
  RelayedStores s;
  s.other.set("decision", "theirs");  // compareSet("" -> mine) loses
  s.other.set("counter", "10");       // a counter whose K is set: the add rewrites K
  s.other.set("text", "not a number");
  StoreBatch batch;
  const size_t lost = batch.compareSet("decision", "", "mine");
  const size_t fresh = batch.add("fresh", 1);
  const size_t refused = batch.add("text", 1);
  const int before = s.kvCalls();
  CHECK_THROWS_AS(s.agent.runBatch(batch), InvalidArgument);
  CHECK(s.kvCalls() - before == 1);
  CHECK(batch.value(lost) == std::optional<Bytes>("theirs"));
  CHECK(batch.number(fresh) == 1);
  CHECK_FALSE(batch.ok(refused));
  CHECK_THROWS_AS(batch.number(refused), InvalidArgument);
  CHECK(s.other.tryGet("decision") == std::optional<Bytes>("theirs"));
  CHECK(s.other.tryGet("text") == std::optional<Bytes>("not a number"));

  // K holding an integer: that add runs as its own call after the transaction.
  StoreBatch rewrite;
  const size_t total = rewrite.add("counter", 1);
  const size_t other = rewrite.add("fresh", 1);
  const size_t matched = rewrite.compareSet("decision", "theirs", "ours");
  s.agent.runBatch(rewrite);
  CHECK(rewrite.number(total) == 11);
  CHECK(rewrite.number(other) == 2);
  CHECK(rewrite.value(matched) == std::optional<Bytes>("ours"));
  CHECK(s.other.tryGet("counter") == std::optional<Bytes>("11"));

  // Two calls on one key cannot share a transaction (etcd refuses a key written twice): in order.
  StoreBatch same;
  const size_t first = same.add("twice", 1);
  const size_t second = same.add("twice", 1);
  s.agent.runBatch(same);
  CHECK(same.number(first) == 1);
  CHECK(same.number(second) == 2);
}

TEST_CASE("etcd store: a batch whose reply is lost after etcd applied it is applied once and "
          "answers what it saw",
          "[etcd][batch]") {
  RelayedStores s;
  s.other.set("gone", "x");
  s.other.set("seen", "before");
  StoreBatch batch;
  const size_t counted = batch.add("count", 1);
  const size_t seen = batch.tryGet("seen");
  const size_t won = batch.compareSet("decision", "", "mine");
  const size_t existed = batch.deleteKey("gone");
  // Between the applied attempt and the retry, another agent writes to each of those keys.
  s.relay.dropNextTxnReply([&] {
    s.other.add("count", 1);
    s.other.set("seen", "after");
    s.other.set("decision", "theirs");
    s.other.set("gone", "back");
  });
  s.agent.runBatch(batch);
  CHECK(s.relay.dropped() == 1);
  CHECK(batch.number(counted) == 1);
  CHECK(batch.value(seen) == std::optional<Bytes>("before"));
  CHECK(batch.value(won) == std::optional<Bytes>("mine"));
  CHECK(batch.number(existed) == 1);
  CHECK(s.other.tryGet("count") == std::optional<Bytes>("2"));  // counted once
  CHECK(s.other.tryGet("gone") == std::optional<Bytes>("back"));
}

// EtcdStore's waits in slices (a round's status, watched until a progress line or the last call
// is due, then again): the next slice resumes the watch where the last one left it, with no read
// of the key, and misses no change made between the two.
#include <catch2/catch.hpp>

#include "drun/common/error.hpp"
#include "drun/etcd/etcd_call_counts.hpp"
#include "drun/etcd/etcd_store.hpp"
#include "etcd_test_options.hpp"

using namespace drun;
using namespace drun::rdzv;
using namespace drun::test;
using namespace std::chrono_literals;

TEST_CASE("etcd store: a wait in slices resumes where the last slice left it, with no read, and "
          "misses no change made between slices", "[etcd]") {
  EtcdCluster cluster;
  EtcdStore waiter(openEtcdSession(etcdStoreOptions(cluster)));
  EtcdStore writer(openEtcdSession(etcdStoreOptions(cluster)));
  writer.set("status", "0");
  CHECK_THROWS_AS(waiter.watch("status", std::string("0"), 300ms), TimeoutError);  // a read, a watch
  writer.set("elsewhere", "x");  // the store moves on, the watched key does not
  const EtcdCallCounts before = etcdCallCounts();
  CHECK_THROWS_AS(waiter.watch("status", std::string("0"), 300ms), TimeoutError);
  EtcdCallCounts slice = etcdCallCounts();
  slice -= before;
  CHECK(slice.range == 0);
  CHECK(slice.watch == 1);
  // Changed between two slices: the next one sees it (the watch replays from the revision known).
  writer.set("status", "1");
  CHECK(waiter.watch("status", std::string("0"), 5s) == std::optional<Bytes>("1"));
  // Another key, or a value already different from the one waited on: read afresh.
  CHECK(waiter.watch("status", std::string("0"), 5s) == std::optional<Bytes>("1"));
  CHECK_THROWS_AS(waiter.watch("elsewhere", std::string("x"), 200ms), TimeoutError);
  writer.add("status", 5);  // a value the last slice of "status" never saw
  CHECK(waiter.watch("status", std::string("1"), 5s) == std::optional<Bytes>("6"));
}

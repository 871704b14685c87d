// Refilling a restarted (empty) store from what the survivors know (src/store_refill.*): one
// round for all, the restart count raised to the most any survivor carries, nothing written to a
// store that still holds the job.
#include <catch2/catch.hpp>

#include "../src/store_refill.hpp"
#include "drun/common/error.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/store/memory_store.hpp"

using namespace drun;
using namespace drun::rdzv;

TEST_CASE("store refill: the first survivor sets the round, the others join it and raise the count",
          "[rendezvous][refill]") {
  MemoryStore first;
  auto second = first.clone(), third = first.clone();
  CHECK(refillStore(first, "job", {5, 1}) == std::optional<uint64_t>(5));
  CHECK(first.tryGet(keys::currentRound("job")) == std::optional<Bytes>("5"));
  // A survivor that knew a later round still joins the first writer's: one round for all.
  CHECK(refillStore(*second, "job", {6, 2}) == std::optional<uint64_t>(5));
  // One that carries less never lowers the count.
  CHECK(refillStore(*third, "job", {5, 0}) == std::optional<uint64_t>(5));
  const auto refill = readRefill(first, "job");
  REQUIRE(refill);
  CHECK(refill->round == 5);
  CHECK(refill->restarts == 2);
}

TEST_CASE("store refill: a store that still holds the job is not refilled", "[rendezvous][refill]") {
  MemoryStore store;
  store.set(keys::currentRound("job"), "3");
  CHECK_FALSE(refillStore(store, "job", {3, 1}));
  CHECK_FALSE(store.tryGet(keys::refill("job")));
  MemoryStore ended;
  ended.set(keys::outcome("job"), "succeeded\n");
  CHECK_FALSE(refillStore(ended, "job", {3, 1}));
}

TEST_CASE("store refill: once the refilled round closed, a late survivor comes back as a newcomer",
          "[rendezvous][refill]") {
  MemoryStore store;
  REQUIRE(refillStore(store, "job", {2, 1}) == std::optional<uint64_t>(2));
  store.set(keys::currentRound("job"), "3");  // round 2 closed
  CHECK_FALSE(refillStore(store, "job", {2, 4}));
  CHECK(readRefill(store, "job")->restarts == 1);
}

TEST_CASE("store refill: a malformed record is named, never believed", "[rendezvous][refill]") {
  CHECK_FALSE(parseRefill(std::optional<Bytes>("7")));
  CHECK_FALSE(parseRefill(std::optional<Bytes>("x\t1")));
  CHECK_FALSE(parseRefill(std::optional<Bytes>("1\t-2")));
  CHECK(parseRefill(std::optional<Bytes>(encodeRefill({9, 4})))->restarts == 4);
  MemoryStore store;
  store.set(keys::refill("job"), "garbage");
  CHECK_THROWS_AS(refillStore(store, "job", {1, 0}), ProtocolError);
}

// PrefixStore: every key, wait, watch, will and deletePrefix lands under the prefix of the
// underlying store, and two prefixes on one store do not see each other.
#include <catch2/catch.hpp>

#include "drun/common/error.hpp"
#include "drun/store/memory_store.hpp"
#include "drun/store/prefix_store.hpp"

using namespace drun::rdzv;
using namespace std::chrono_literals;

TEST_CASE("PrefixStore puts every key under its prefix", "[rendezvous][store]") {
  auto shared = MemoryStore::makeShared();
  auto base = std::make_shared<MemoryStore>(shared);
  PrefixStore a("a/", base), b("b/", base);
  a.set("k", "1");
  b.set("k", "2");
  CHECK(base->get("a/k", 1s) == "1");
  CHECK(b.get("k", 1s) == "2");
  CHECK(a.add("n", 5) == 5);
  CHECK(base->tryGet("a/n") == std::optional<Bytes>("5"));
  CHECK(a.compareSet("k", "1", "3") == "3");
  a.multiSet({"x", "y"}, {"X", "Y"});
  CHECK(a.multiGet({"x", "y"}, 1s) == std::vector<Bytes>{"X", "Y"});
  CHECK(a.check({"x", "y"}));
  CHECK_FALSE(b.check({"x"}));
  a.append("x", "+");
  CHECK(a.get("x", 1s) == "X+");
  CHECK_THROWS_AS(b.wait({"x"}, 20ms), drun::TimeoutError);
  CHECK(a.watch("k", Bytes("1"), 1s) == std::optional<Bytes>("3"));
  CHECK(a.deleteKey("y"));
  CHECK(a.deletePrefix("x") == 1);
  CHECK(base->tryGet("b/k"));
  CHECK_THROWS_AS(a.deletePrefix(""), drun::InvalidArgument);
  CHECK_THROWS_AS(PrefixStore("p/", nullptr), drun::InvalidArgument);
}

TEST_CASE("PrefixStore prefixes the keys of a will", "[rendezvous][store]") {
  auto shared = MemoryStore::makeShared();
  auto dying = std::make_shared<MemoryStore>(shared);
  MemoryStore observer(shared);
  PrefixStore view("job/", dying);
  view.setWill({{{"gone", "yes"}}, {{"count", 1}}, {}});
  dying->fireWillForTest();
  CHECK(observer.get("job/gone", 1s) == "yes");
  CHECK(observer.get("job/count", 1s) == "1");
}

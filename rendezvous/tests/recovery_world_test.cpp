// A shrink's or a grow's world record (recovery/<g>/world, drun/rendezvous/recovery_keys.hpp): what the
// claimer writes is what every agent and worker reads back, ranks renumber densely in the order
// kept, and a value not written by drun is refused naming it.
#include <catch2/catch.hpp>

#include "drun/common/error.hpp"
#include "drun/rendezvous/recovery_keys.hpp"

using namespace drun::rdzv::recovery;

TEST_CASE("recovery world: a shrink's record round-trips and renumbers densely", "[rendezvous][recovery]") {
  const World kept{{0, 1, 4, 5}, {0, 2}};
  CHECK(encodeWorld(kept) == "0,1,4,5\t0,2");
  const World back = parseWorld(encodeWorld(kept));
  CHECK(back.ranks == kept.ranks);
  CHECK(back.nodeRanks == kept.nodeRanks);
  CHECK(back.renumber(4) == 2);
  CHECK(back.renumber(5) == 3);
  CHECK(back.renumber(2) == -1);  // dropped
  CHECK(back.renumberNode(2) == 1);
  CHECK(back.renumberNode(1) == -1);
  CHECK(world("P/", 3) == "P/recovery/3/world");
}

TEST_CASE("recovery world: a grow's record keeps every rank and adds ranks and nodes after them",
          "[rendezvous][recovery]") {
  World grown{{0, 1, 2, 3}, {0, 1}};
  grown.addedRanks = 2;
  grown.addedNodes = 1;
  CHECK(encodeWorld(grown) == "0,1,2,3\t0,1\t2\t1");
  const World back = parseWorld(encodeWorld(grown));
  CHECK(back.grows());
  CHECK(back.size() == 6);
  CHECK(back.nodeCount() == 3);
  CHECK(back.renumber(3) == 3);
  CHECK(back.renumberNode(1) == 1);
  const World shrunk = parseWorld("0,2\t0");
  CHECK_FALSE(shrunk.grows());
  CHECK(shrunk.size() == 2);
  CHECK(shrunk.nodeCount() == 1);
}

TEST_CASE("recovery world: a record drun did not write is refused, naming it", "[rendezvous][recovery]") {
  for (const char* bad : {"", "0,1", "0,1\t", "\t0", "0,0\t0", "0,1\t1,1", "0,-1\t0", "a\t0", "0\t0\t0",
                          "0\t0\t0\t1", "0\t0\t1\t0", "0\t0\t1", "0\t0\t1\t1\t1", "0\t0\tx\t1", "0\t0\t-1\t1"}) {
    INFO("'" << bad << "'");
    CHECK_THROWS_AS(parseWorld(bad), drun::ProtocolError);
  }
  CHECK_THROWS_WITH(parseWorld("0,x\t0"), Catch::Contains("0,x"));
}

TEST_CASE("recovery world: a node's place numbered in one generation is renumbered through the worlds after it",
          "[rendezvous][recovery]") {
  // Three nodes of two ranks; generation 1 shrinks without node 1, generation 2 grows by a node.
  const World shrink = parseWorld("0,1,4,5\t0,2");
  const World grow = parseWorld("0,1,2,3\t0,1\t2\t1");
  // Node 2 (ranks 4, 5 in the roster) is node 1 with ranks from 2 after the shrink, and stays so.
  auto place = renumberPlace({2, 4}, {shrink});
  REQUIRE(place.has_value());
  CHECK(place->nodeRank == 1);
  CHECK(place->rankOffset == 2);
  place = renumberPlace({2, 4}, {shrink, grow});
  REQUIRE(place.has_value());
  CHECK(place->nodeRank == 1);
  CHECK(place->rankOffset == 2);
  // The node the grow added, numbered in the grow's generation, is where it was put.
  place = renumberPlace({2, 4}, {});
  REQUIRE(place.has_value());
  CHECK(place->nodeRank == 2);
  CHECK(place->rankOffset == 4);
  CHECK_FALSE(renumberPlace({1, 2}, {shrink, grow}).has_value());  // the shrink dropped node 1
}

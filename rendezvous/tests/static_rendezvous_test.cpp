// The static rendezvous and the backend choice of makeRendezvous.
#include <catch2/catch.hpp>

#include "drun/common/error.hpp"
#include "drun/rendezvous/rendezvous.hpp"
#include "drun/rendezvous/static_rendezvous.hpp"

using namespace drun;
using namespace drun::rdzv;

namespace {
RendezvousOptions staticOptions(int nodes, std::optional<int> nodeRank, int perNode = 4) {
  RendezvousOptions o;
  o.backend = RendezvousBackend::Static;
  o.minNodes = o.maxNodes = nodes;
  o.nodeRank = nodeRank;
  o.localWorldSize = perNode;
  o.masterAddr = "10.0.0.1";
  o.masterPort = 23456;
  return o;
}
}  // namespace

TEST_CASE("static: ranks follow the node rank, master from the options", "[rendezvous]") {
  auto r = makeRendezvous(staticOptions(3, 2))->next();
  CHECK(r.nodeRank == 2);
  CHECK(r.nodeCount == 3);
  CHECK(r.worldSize == 12);
  CHECK(r.rankOffset == 8);
  CHECK(r.masterAddr == "10.0.0.1");
  CHECK(r.masterPort == 23456);
  CHECK(r.hosts.size() == 3);
  CHECK(r.storePrefix.empty());

  auto o = staticOptions(2, 0);
  o.masterAddr.clear();
  o.masterPort.reset();
  auto d = makeRendezvous(o)->next();
  CHECK(d.masterAddr == "127.0.0.1");
  CHECK(d.masterPort == kDefaultStaticMasterPort);
}

TEST_CASE("static: bad options are clear errors", "[rendezvous]") {
  CHECK_THROWS_WITH(makeRendezvous(staticOptions(2, std::nullopt)),
                    Catch::Contains("needs --node-rank"));
  CHECK_THROWS_WITH(makeRendezvous(staticOptions(2, 2)), Catch::Contains("out of range"));
  auto elastic = staticOptions(2, 0);
  elastic.minNodes = 1;
  CHECK_THROWS_WITH(makeRendezvous(elastic), Catch::Contains("fixed --nnodes"));
}

TEST_CASE("rendezvous backends: names read and written in one place, with their capabilities",
          "[rendezvous]") {
  for (RendezvousBackend b : {RendezvousBackend::C10d, RendezvousBackend::Etcd, RendezvousBackend::Static})
    CHECK(parseRendezvousBackend(toString(b)) == b);
  CHECK(parseRendezvousBackend("etcd-v3") == RendezvousBackend::Etcd);
  // Names no backend has (torchrun's etcd-v2 speaks etcd's v2 API, which drun does not).
  for (const char* unknown : {"zookeeper", "etcd-v2", "C10D", "", "c10d "})
    CHECK_FALSE(parseRendezvousBackend(unknown));
  CHECK(capabilities(RendezvousBackend::C10d).hostsStore);
  CHECK_FALSE(capabilities(RendezvousBackend::Etcd).hostsStore);
  CHECK(capabilities(RendezvousBackend::Etcd).needsEndpoint);
  CHECK(capabilities(RendezvousBackend::Etcd).elastic);
  const BackendCapabilities fixed = capabilities(RendezvousBackend::Static);
  CHECK_FALSE((fixed.needsEndpoint || fixed.hostsStore || fixed.elastic || fixed.sharedStore));
}

TEST_CASE("makeRendezvous: backend choice and option checks", "[rendezvous]") {
  RendezvousOptions single;
  single.localWorldSize = 2;
  CHECK(makeRendezvous(single)->next().worldSize == 2);

  RendezvousOptions bad;
  bad.minNodes = 3;
  bad.maxNodes = 2;
  CHECK_THROWS_AS(makeRendezvous(bad), InvalidArgument);

  RendezvousOptions noEndpoint;
  noEndpoint.maxNodes = 2;
  CHECK_THROWS_WITH(makeRendezvous(noEndpoint), Catch::Contains("--rdzv-endpoint"));
}

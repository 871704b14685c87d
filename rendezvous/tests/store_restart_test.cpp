// A store server restarted empty under a running job (a drun-rendezvous daemon restarted): after
// the loss, reconnectAfterLoss() refills the fresh store, and the round the survivors form then
// carries their running round on (RoundResult::continuesPrevious) only when it has the same
// members at the same node ranks: every member decides alike, so the agents either all keep
// their workers or all restart them.
#include <catch2/catch.hpp>

#include "c10d_test_support.hpp"

using namespace drun;
using namespace drun::rdzv;
using namespace drun::rdzv::test;
using namespace std::chrono_literals;

namespace {

// Restarts the store empty under `agents`, and waits until each learned the store is gone (its
// watcher's StoreLost).
void restartUnder(RestartableStore& store, const std::vector<Rendezvous*>& agents) {
  std::vector<std::unique_ptr<FirstChange>> lost;
  for (Rendezvous* a : agents) lost.push_back(std::make_unique<FirstChange>(*a, "store"));
  store.restartEmpty();
  for (auto& l : lost) CHECK_THAT(l->get(), Catch::Contains("store"));
}

// Two agents of one job with options `o`, their first round formed.
struct FormedPair {
  std::unique_ptr<Rendezvous> a, b;
  RoundResult ra, rb;
};
FormedPair formPair(RestartableStore& store, const RendezvousOptions& o, int localA = 1, int localB = 1) {
  FormedPair p{store.agent(withNode(o, "127.0.0.1", localA)), store.agent(withNode(o, "127.0.0.1", localB)), {}, {}};
  auto fa = startNext(*p.a);
  auto fb = startNext(*p.b);
  p.ra = getWithin(fa);
  p.rb = getWithin(fb);
  return p;
}

std::future<bool> startReconnect(Rendezvous& r) {
  return std::async(std::launch::async, [&r] { return r.reconnectAfterLoss(0); });
}

}  // namespace

TEST_CASE("store restart: the same members re-form the refilled round, which carries theirs on",
          "[rendezvous][refill]") {
  RestartableStore store;
  auto [a, b, ra, rb] = formPair(store, options(2, 2), 2, 1);
  CHECK_FALSE(ra.continuesPrevious);  // a first round carries nothing on
  restartUnder(store, {a.get(), b.get()});
  auto ca = startReconnect(*a);
  auto cb = startReconnect(*b);
  CHECK(getWithin(ca));  // restarted empty: each survivor refilled it (or joined the refill)
  CHECK(getWithin(cb));
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  const RoundResult na = getWithin(fa), nb = getWithin(fb);
  CHECK(na.round == ra.round + 1);
  CHECK(na.continuesPrevious);
  CHECK(nb.continuesPrevious);
  CHECK(na.nodeRank == ra.nodeRank);
  CHECK(nb.nodeRank == rb.nodeRank);
  CHECK(na.rankOffset == ra.rankOffset);
  CHECK(na.restartCount == ra.restartCount);
  // The next round (a re-form after a failure, say) carries nothing on.
  a->abandon();
  fb = startNext(*b);
  CHECK_THROWS(getWithin(fb));  // 2:2 without hostA: below MIN at once (replace_timeout 0)
}

TEST_CASE("store restart: a member that does not come back makes the refilled round another one",
          "[rendezvous][refill]") {
  RestartableStore store;
  auto [a, b, ra, rb] = formPair(store, options(1, 2));
  restartUnder(store, {a.get(), b.get()});
  b->abandon();  // its agent died with the daemon away
  auto ca = startReconnect(*a);
  CHECK(getWithin(ca));
  auto fa = startNext(*a);
  const RoundResult alone = getWithin(fa);  // the last call, with hostA alone
  CHECK(alone.nodeCount == 1);
  CHECK_FALSE(alone.continuesPrevious);
}

TEST_CASE("store restart: a member whose round failed carries a restart: the refilled round is another one",
          "[rendezvous][refill]") {
  RestartableStore store;
  auto o = options(2, 2);
  o.maxRestarts = 3;
  auto [a, b, ra, rb] = formPair(store, o);
  FailureRecord failure;
  failure.rank = 1;
  failure.exitCode = 3;
  CHECK_FALSE(b->reportFailure(failure).final);
  restartUnder(store, {a.get(), b.get()});
  auto ca = startReconnect(*a);
  auto cb = startReconnect(*b);
  CHECK(getWithin(ca));
  CHECK(getWithin(cb));
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  const RoundResult na = getWithin(fa), nb = getWithin(fb);
  CHECK(na.restartCount == 1);
  CHECK_FALSE(na.continuesPrevious);
  CHECK_FALSE(nb.continuesPrevious);
}

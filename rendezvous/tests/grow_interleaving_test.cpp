// A grow in place (docs/recovery.md "Elastic in place") with a death at each point of its store
// steps, over MemoryStore through HookStore (docs/interleavings.md): the newcomer dying at each
// point of taking the grow's place, the claimer dying at each point of claiming and posting it,
// another survivor dying at each point of the claim, the post and the take. Whatever the point: the place ends taken by the newcomer as a member (counted in `grown`, its
// loss told to the survivors and offered again at its node rank), taken by nobody (withdrawn,
// nothing counted), or won by a newcomer that never became a member (the withdraw fails: the
// grow's generation falls back at its deadline); a grow claimed by a dead claimer is never
// claimed twice; a dead survivor's place is claimed by exactly one node; and the survivors
// re-form afterwards (one round, distinct node ranks) with `present` back to 0.
#include <catch2/catch.hpp>

#include <atomic>
#include <future>
#include <thread>

#include "hooked_agent.hpp"

using namespace drun::rdzv;
using namespace drun::rdzv::test;

namespace {

HookedAgent growingAgent(const std::shared_ptr<MemoryStore::Shared>& shared, const std::string& name,
                         NodeLink::Hook hook, int minNodes, int maxNodes,
                         std::optional<std::chrono::milliseconds> lastCall = std::nullopt) {
  return hookedAgent(shared, name, std::move(hook), minNodes, maxNodes, "grow", lastCall);
}

int64_t growCounter(MemoryStore& observer, const std::string& key) {
  return keys::parseCounter(observer.tryGet(key)).value_or(0);
}

struct GrowPoint {
  bool killed = false;    // the point was reached: the newcomer died there
  bool tookSeat = false;  // its next() returned the grow's place
};

// hostA runs alone (1:2); newcomer hostC waits in round 1, hostA claims a grow and posts it, and
// hostC dies at its `point`-th store operation once the place is posted.
GrowPoint newcomerDiesAt(int point) {
  auto shared = MemoryStore::makeShared();
  MemoryStore observer(shared);
  std::atomic<int> counted{-1};
  std::atomic<bool> killed{false};
  std::string killedAt;
  HookedAgent c;
  auto hook = [&](const StoreOp& op) {
    if (op.call != "join") return;
    if (counted.load() < 0 && op.key.ends_with("/vacancies") && observer.check({keys::vacancies("grow", 0)}))
      counted = 0;
    if (counted.load() < 0) return;
    if (counted.fetch_add(1) == point && !killed.exchange(true)) {
      killedAt = op.describe();
      c.link->dropAll(true);
    }
  };
  HookedAgent a = growingAgent(shared, "hostA", nullptr, 1, 2);
  auto fa = startNext(*a.rendezvous);
  REQUIRE(getWithin(fa).nodeCount == 1);
  c = growingAgent(shared, "hostC", hook, 1, 2);
  auto fc = std::async(std::launch::async, [&] {
    c.link->beginCall("join");
    GrowPoint outcome;
    try {
      const RoundResult took = c.rendezvous->next();
      outcome.tookSeat = true;
      CHECK(took.round == 0);
      CHECK(took.nodeRank == 1);
      CHECK(took.nodeCount == 2);
    } catch (const NetworkError&) {
      CHECK(killed.load());
    }
    c.link->endCall();
    return outcome;
  });
  awaitArrivals(observer, "grow", 1, 1);
  std::optional<Vacancy> place = a.rendezvous->claimGrowth(1, 1);
  REQUIRE(place.has_value());
  FirstChange grownLost(*a.rendezvous, "member lost");
  a.rendezvous->postVacancy(*place, 1, 0);
  GrowPoint outcome = getWithin(fc);
  outcome.killed = killed.load();

  const auto taker = observer.tryGet(keys::vacancyTaker("grow", 0, place->lostId));
  const int64_t grown = growCounter(observer, keys::grown("grow", 0));
  INFO("point " << point << " (" << killedAt << "), taker " << taker.value_or("(none)") << ", grown " << grown);
  CHECK(growCounter(observer, keys::replaced("grow", 0)) == 0);
  if (!outcome.killed) {
    CHECK(outcome.tookSeat);
    CHECK(grown == 1);
    CHECK_FALSE(a.rendezvous->withdrawVacancy(*place));
    a.rendezvous->endGrowth(*place);
    FirstChange end(*a.rendezvous, "succeeded");
    CHECK(a.rendezvous->finish());
    CHECK_FALSE(end.reportedWithin(200ms));  // the grown member has not finished
    CHECK(c.rendezvous->finish());
    end.get();
    a.rendezvous->leave();
    c.rendezvous->leave();
    CHECK(growCounter(observer, keys::present("grow")) == 0);
    return outcome;
  }
  if (!taker) {
    CHECK(grown == 0);
    CHECK(a.rendezvous->withdrawVacancy(*place));
  } else if (grown == 1) {
    // A member, then lost: the survivor is told and can offer its place (node rank 1) again.
    CHECK_THAT(grownLost.get(), Catch::Contains("hostC"));
    std::vector<Vacancy> again = a.rendezvous->claimLostMembers();
    REQUIRE(again.size() == 1);
    CHECK(again[0].nodeRank == 1);
    CHECK(again[0].rankOffset == 1);
  } else {
    // Won, and died before its batch: nobody holds the place and the withdraw fails.
    CHECK_FALSE(a.rendezvous->withdrawVacancy(*place));
    CHECK_FALSE(observer.check({keys::assign("grow", 0, taker->substr(0, taker->find('\t')))}));
  }
  a.rendezvous->endGrowth(*place);
  // The survivor re-forms alone (--nnodes 1:2): nobody is waited for.
  auto again = startNext(*a.rendezvous);
  const RoundResult next = getWithin(again);
  CHECK(next.round == 1);
  CHECK(next.nodeCount == 1);
  a.rendezvous->leave();
  c.rendezvous.reset();
  CHECK(growCounter(observer, keys::present("grow")) == 0);
  return outcome;
}

// hostA and hostB run (1:3), hostC waits in round 1; hostA claims a grow and posts it, dying
// before its `point`-th store operation of the two calls. Returns whether hostA died.
bool growClaimerDiesAt(int point) {
  auto shared = MemoryStore::makeShared();
  MemoryStore observer(shared);
  std::atomic<int> counted{0};
  std::atomic<bool> killed{false};
  // hostB re-forms below while hostC, which took the place, is still to call next(): at MIN 1 a
  // round closes one last call after its first node, so a short one (under load) could close
  // hostB's round alone and leave hostC to wait behind it. A last call that outlasts the gap.
  const auto lastCall = std::chrono::milliseconds(1s) * kTimeScale;
  HookedAgent a;
  a = growingAgent(shared, "hostA", [&](const StoreOp& op) {
    if (op.call == "claim" && counted.fetch_add(1) == point && !killed.exchange(true)) a.link->dropAll(true);
  }, 1, 3, lastCall);
  HookedAgent b = growingAgent(shared, "hostB", nullptr, 1, 3, lastCall);
  auto fa = startNext(*a.rendezvous);
  auto fb = startNext(*b.rendezvous);
  REQUIRE(getWithin(fa).nodeCount == 2);
  getWithin(fb);
  HookedAgent c = growingAgent(shared, "hostC", nullptr, 1, 3, lastCall);
  auto fc = startNext(*c.rendezvous);
  awaitArrivals(observer, "grow", 1, 1);
  FirstChange lostA(*b.rendezvous, "member lost");
  std::optional<Vacancy> place;
  a.link->beginCall("claim");
  try {
    place = a.rendezvous->claimGrowth(2, 2);
    REQUIRE(place.has_value());
    a.rendezvous->postVacancy(*place, 1, 0);
  } catch (const NetworkError&) {
    CHECK(killed.load());
  }
  a.link->endCall();
  const std::string first = keys::growPlace(0);
  if (!killed.load()) {
    CHECK(observer.tryGet(keys::vacancy("grow", 0, first)).has_value());
    getWithin(fc);  // hostC takes the place
    return false;
  }
  lostA.get();
  // The grow hostA claimed stays its own (no second claim of grow 0); unclaimed, hostB claims it.
  const bool claimedByA = observer.tryGet(keys::vacancyClaim("grow", 0, first)).has_value();
  std::optional<Vacancy> byB = b.rendezvous->claimGrowth(2, 2);
  CHECK(byB.has_value() == !claimedByA);
  if (byB) CHECK(byB->lostId == first);
  // hostB re-forms with hostC (hostA's loss: the restart path): hostC either took the place hostA
  // posted (a member of round 0, re-forming) or waits in round 1.
  auto next = startNext(*b.rendezvous);
  RoundResult rc = getWithin(fc);
  if (rc.round == 0) {
    CHECK(rc.nodeRank == 2);
    fc = startNext(*c.rendezvous);
    rc = getWithin(fc);
  }
  CHECK(getWithin(next).nodeCount == 2);
  CHECK(rc.nodeCount == 2);
  b.rendezvous->leave();
  c.rendezvous->leave();
  CHECK(growCounter(observer, keys::present("grow")) == 0);
  return true;
}

struct SurvivorPoint {
  bool killed = false;      // hostB died at the point (else: the grow ended before it)
  bool newcomerTold = false;  // hostC's watcher reported hostB's loss (it died after the claim read the losses)
};

// hostA and hostB run (1:3), hostC waits in round 1; hostA claims a grow and posts it, hostC takes
// it, and hostB (a survivor that claimed nothing) dies at the `point`-th store operation of the
// claim, the post and the take (counted across hostA's and hostC's calls).
SurvivorPoint survivorDiesAt(int point) {
  auto shared = MemoryStore::makeShared();
  MemoryStore observer(shared);
  std::atomic<int> counted{-1};
  std::atomic<bool> killed{false};
  std::string killedAt;
  HookedAgent b;
  auto count = [&](const StoreOp& op) {
    if (counted.load() < 0 || counted.fetch_add(1) != point || killed.exchange(true)) return;
    killedAt = op.describe();
    b.link->dropAll(true);
  };
  HookedAgent a = growingAgent(shared, "hostA", [&](const StoreOp& op) {
    if (op.call == "claim") count(op);
  }, 1, 3);
  b = growingAgent(shared, "hostB", nullptr, 1, 3);
  auto fa = startNext(*a.rendezvous);
  auto fb = startNext(*b.rendezvous);
  REQUIRE(getWithin(fa).nodeCount == 2);
  REQUIRE(getWithin(fb).nodeCount == 2);
  HookedAgent c = growingAgent(shared, "hostC", [&](const StoreOp& op) {
    if (op.call == "join" && observer.check({keys::vacancies("grow", 0)})) count(op);
  }, 1, 3);
  FirstChange lostByC(*c.rendezvous, "member lost");
  auto fc = std::async(std::launch::async, [&] {
    c.link->beginCall("join");
    RoundResult took = c.rendezvous->next();
    c.link->endCall();
    return took;
  });
  awaitArrivals(observer, "grow", 1, 1);
  FirstChange lostByA(*a.rendezvous, "member lost");
  counted = 0;
  a.link->beginCall("claim");
  std::optional<Vacancy> place = a.rendezvous->claimGrowth(2, 2);
  REQUIRE(place.has_value());
  a.rendezvous->postVacancy(*place, 1, 0);
  a.link->endCall();
  // The newcomer takes the place whatever happened to hostB: a member of round 0 at node rank 2.
  const RoundResult took = getWithin(fc);
  CHECK(took.round == 0);
  CHECK(took.nodeRank == 2);
  CHECK(took.worldSize == 3);
  CHECK(growCounter(observer, keys::grown("grow", 0)) == 1);
  CHECK_FALSE(a.rendezvous->withdrawVacancy(*place));
  a.rendezvous->endGrowth(*place);
  CHECK(growCounter(observer, keys::grows("grow", 0)) == 1);
  SurvivorPoint outcome;
  outcome.killed = killed.load();
  INFO("point " << point << " (" << killedAt << ")");
  if (!outcome.killed) b.link->dropAll(true);  // past the take: hostB dies with the grow decided
  CHECK_THAT(lostByA.get(), Catch::Contains("hostB"));
  // hostC is told of the loss unless hostB died before the claim read the round's losses (then
  // the grow was claimed with that loss known: not news to the place's taker).
  outcome.newcomerTold = lostByC.reportedWithin(500ms);
  // hostB's place is claimed by exactly one survivor, with hostB's numbering (node rank 1, rank 1).
  std::vector<Vacancy> byA = a.rendezvous->claimLostMembers();
  std::vector<Vacancy> byC = c.rendezvous->claimLostMembers();
  REQUIRE(byA.size() + byC.size() == 1);
  const Vacancy& lost = byA.empty() ? byC.front() : byA.front();
  CHECK(lost.nodeRank == 1);
  CHECK(lost.rankOffset == 1);
  // The survivors re-form (a second loss while the grow's generation forms): one round of two.
  auto nextA = startNext(*a.rendezvous);
  auto nextC = startNext(*c.rendezvous);
  const RoundResult ra = getWithin(nextA), rc = getWithin(nextC);
  checkRound({ra, rc}, {1, 1});
  CHECK(ra.round == 1);
  a.rendezvous->leave();
  c.rendezvous->leave();
  b.rendezvous.reset();
  CHECK(growCounter(observer, keys::present("grow")) == 0);
  return outcome;
}

}  // namespace

TEST_CASE("grow interleavings: the newcomer dies at each point of taking a grow's place",
          "[rendezvous][vacancy][grow][v2]") {
  int points = 0, whole = 0;
  for (int point = 0; point < 40; ++point) {
    const GrowPoint outcome = newcomerDiesAt(point);
    // Past its last store operation: the place was taken whole (checked). Seen once in a while
    // before the take's last point too (the offer read in a wake that raced the post): the next
    // points are tried again before the enumeration ends.
    if (!outcome.killed && ++whole >= 3) break;
    if (outcome.killed) ++points;
  }
  CHECK(points >= 4);  // the offers read, the taker's compare_set, the take's batch, the wake
}

TEST_CASE("grow interleavings: the claimer dies at each point of claiming and posting a grow",
          "[rendezvous][vacancy][grow][v2]") {
  int points = 0;
  for (int point = 0; point < 40 && growClaimerDiesAt(point); ++point) ++points;
  CHECK(points >= 4);  // the look, the waiting nodes' flags, the claim, the offer
}

TEST_CASE("grow interleavings: another survivor dies at each point of a grow",
          "[rendezvous][vacancy][grow][v2]") {
  int points = 0, told = 0;
  for (int point = 0; point < 40; ++point) {
    const SurvivorPoint outcome = survivorDiesAt(point);
    if (!outcome.killed) break;
    ++points;
    if (outcome.newcomerTold) ++told;
  }
  CHECK(points >= 6);  // the claim's look and compare_set, the post, the take's reads and batch
  CHECK(told < points);  // a loss before the claim read the round's losses is not news to the newcomer
  CHECK(told > 0);       // one after it is (the claim's compare_set, the post, the take)
}

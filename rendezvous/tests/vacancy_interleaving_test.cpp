// A lost member's place and a spare dying at each point of taking it (docs/recovery.md "A lost
// node"), over MemoryStore through HookStore (docs/interleavings.md): whatever the point, the place
// ends taken by the spare as a member whose loss the survivor is told of and can offer again,
// taken by nobody (the survivor withdraws it), or won by a spare that never became a member (the
// survivor's withdraw fails, and its recovery falls back at recovery_timeout); never two holders
// of one node rank, and the survivor re-forms the job afterwards with `present` back to 0.
#include <catch2/catch.hpp>

#include <atomic>
#include <future>
#include <thread>
#include <set>

#include "hooked_agent.hpp"

using namespace drun::rdzv;
using namespace drun::rdzv::test;

namespace {

HookedAgent hookedAgent(const std::shared_ptr<MemoryStore::Shared>& shared, const std::string& name,
                        NodeLink::Hook hook, int minNodes = 1, int maxNodes = 2) {
  return drun::rdzv::test::hookedAgent(shared, name, std::move(hook), minNodes, maxNodes, "vac");
}

// What one run at one point came to.
struct PointOutcome {
  bool killed = false;    // the point was reached: the spare died there
  bool tookSeat = false;  // the spare's next() returned its place
};

PointOutcome spareDiesAt(int point) {
  auto shared = MemoryStore::makeShared();
  MemoryStore observer(shared);
  std::atomic<int> counted{-1};  // the spare's store operations since it first read the offers
  std::atomic<bool> killed{false};
  std::string killedAt;
  HookedAgent spare;
  auto spareHook = [&](const StoreOp& op) {
    if (op.call != "join") return;
    if (counted.load() < 0 && op.key.ends_with("/vacancies")) counted = 0;
    if (counted.load() < 0) return;
    if (counted.fetch_add(1) == point && !killed.exchange(true)) {
      killedAt = op.describe();
      spare.link->dropAll(true);
    }
  };
  HookedAgent a = hookedAgent(shared, "hostA", nullptr);
  HookedAgent b = hookedAgent(shared, "hostB", nullptr);
  auto fa = startNext(*a.rendezvous);
  auto fb = startNext(*b.rendezvous);
  const RoundResult ra = getWithin(fa);
  const RoundResult rb = getWithin(fb);
  REQUIRE(ra.nodeCount == 2);
  {
    FirstChange lost(*a.rendezvous, "member lost");
    b.link->dropAll(true);  // hostB dies
    lost.get();
  }
  std::vector<Vacancy> claimed = a.rendezvous->claimLostMembers();
  REQUIRE(claimed.size() == 1);
  a.rendezvous->postVacancy(claimed[0], 1, 1);

  FirstChange spareLost(*a.rendezvous, "member lost");
  spare = hookedAgent(shared, "spareC", spareHook);
  spare.link->beginCall("join");
  PointOutcome outcome;
  try {
    const RoundResult took = spare.rendezvous->next();
    outcome.tookSeat = true;
    CHECK(took.nodeRank == rb.nodeRank);
    CHECK(took.round == 0);
  } catch (const NetworkError&) {
    CHECK(killed.load());
  }
  spare.link->endCall();
  outcome.killed = killed.load();

  const auto taker = observer.tryGet(keys::vacancyTaker("vac", 0, claimed[0].lostId));
  const int64_t replaced = keys::parseCounter(observer.tryGet(keys::replaced("vac", 0))).value_or(0);
  INFO("point " << point << " (" << killedAt << "), taker " << taker.value_or("(none)") << ", replaced " << replaced);
  if (!outcome.killed) {
    // Past its last operation: a member in the lost one's place, the job ends with it.
    CHECK(outcome.tookSeat);
    CHECK(replaced == 1);
    CHECK_FALSE(a.rendezvous->withdrawVacancy(claimed[0]));
    FirstChange end(*a.rendezvous, "succeeded");
    CHECK(a.rendezvous->finish());
    CHECK(spare.rendezvous->finish());
    end.get();
    a.rendezvous->leave();
    spare.rendezvous->leave();
    CHECK(keys::parseCounter(observer.tryGet(keys::present("vac"))).value_or(0) == 0);
    return outcome;
  }
  if (!taker) {
    CHECK(replaced == 0);
    CHECK(a.rendezvous->withdrawVacancy(claimed[0]));  // nobody took it: withdrawn
  } else if (replaced == 1) {
    // A member, then lost: the survivor is told and can offer its place again.
    CHECK_THAT(spareLost.get(), Catch::Contains("spareC"));
    std::vector<Vacancy> again = a.rendezvous->claimLostMembers();
    REQUIRE(again.size() == 1);
    CHECK(again[0].nodeRank == rb.nodeRank);
    CHECK(again[0].lostId != claimed[0].lostId);
  } else {
    // Won and died before it became a member: nobody holds the place, the offer cannot be
    // withdrawn, and the survivor's recovery falls back at its deadline.
    CHECK_FALSE(a.rendezvous->withdrawVacancy(claimed[0]));
    CHECK_FALSE(observer.check({keys::assign("vac", 0, taker->substr(0, taker->find('\t')))}));
  }
  // The survivor re-forms alone (--nnodes 1:2): nobody is waited for.
  auto again = startNext(*a.rendezvous);
  const RoundResult next = getWithin(again);
  CHECK(next.round == 1);
  CHECK(next.nodeCount == 1);
  a.rendezvous->leave();
  spare.rendezvous.reset();
  CHECK(keys::parseCounter(observer.tryGet(keys::present("vac"))).value_or(0) == 0);
  return outcome;
}

// hostA claims hostC's loss and posts its place, dying before its `point`-th store operation of
// the two calls; hostB, told of hostA's loss, claims what is left. Returns whether hostA died.
bool claimerDiesAt(int point) {
  auto shared = MemoryStore::makeShared();
  MemoryStore observer(shared);
  std::atomic<int> counted{0};
  std::atomic<bool> killed{false};
  HookedAgent a;
  a = hookedAgent(shared, "hostA", [&](const StoreOp& op) {
    if (op.call == "claim" && counted.fetch_add(1) == point && !killed.exchange(true)) a.link->dropAll(true);
  }, 1, 3);
  HookedAgent b = hookedAgent(shared, "hostB", nullptr, 1, 3);
  HookedAgent c = hookedAgent(shared, "hostC", nullptr, 1, 3);
  std::vector<std::future<RoundResult>> joins;
  for (HookedAgent* n : {&a, &b, &c}) joins.push_back(startNext(*n->rendezvous));
  std::vector<RoundResult> rounds;
  for (auto& f : joins) rounds.push_back(getWithin(f));
  REQUIRE(rounds[0].nodeCount == 3);
  {
    FirstChange lost(*b.rendezvous, "member lost");
    c.link->dropAll(true);
    lost.get();
  }
  FirstChange lostA(*b.rendezvous, "member lost");
  std::string cId;
  a.link->beginCall("claim");
  try {
    std::vector<Vacancy> claimed = a.rendezvous->claimLostMembers();
    REQUIRE(claimed.size() == 1);
    cId = claimed[0].lostId;
    a.rendezvous->postVacancy(claimed[0], 1, 1);
  } catch (const NetworkError&) {
    CHECK(killed.load());
  }
  a.link->endCall();
  if (!killed.load()) {
    CHECK(observer.tryGet(keys::vacancy("vac", 0, cId)).has_value());
    return false;
  }
  lostA.get();
  std::vector<Vacancy> byB = b.rendezvous->claimLostMembers();
  // hostA's place always; hostC's only when hostA's claim on it never arrived. Never twice.
  std::set<int> ranks;
  for (const Vacancy& v : byB) CHECK(ranks.insert(v.nodeRank).second);
  CHECK(ranks.count(rounds[0].nodeRank) == 1);
  const bool cToB = ranks.count(rounds[2].nodeRank) == 1;
  CHECK(b.rendezvous->claimLostMembers().empty());
  // hostC's loss is claimed: by hostB now, or by hostA (which may have offered it before dying).
  for (const Vacancy& v : byB)
    if (v.nodeRank == rounds[2].nodeRank) cId = v.lostId;
  if (cToB) CHECK_FALSE(observer.tryGet(keys::vacancy("vac", 0, cId)).has_value());
  if (!cId.empty()) CHECK(observer.tryGet(keys::vacancyClaim("vac", 0, cId)).has_value());
  // hostB re-forms alone (the second loss: the restart path).
  auto next = startNext(*b.rendezvous);
  CHECK(getWithin(next).nodeCount == 1);
  b.rendezvous->leave();
  CHECK(keys::parseCounter(observer.tryGet(keys::present("vac"))).value_or(0) == 0);
  return true;
}

// Spares hostC and hostD wait for hostB's place; hostD looks at the offers (woken) before hostC's
// `point`-th store operation of its take. Returns whether the point was reached.
bool spareRacesAt(int point) {
  auto shared = MemoryStore::makeShared();
  MemoryStore observer(shared);
  HookedAgent a = hookedAgent(shared, "hostA", nullptr);
  HookedAgent b = hookedAgent(shared, "hostB", nullptr);
  auto fa = startNext(*a.rendezvous);
  auto fb = startNext(*b.rendezvous);
  getWithin(fa);
  const RoundResult rb = getWithin(fb);
  std::atomic<int> dLooks{0};
  std::atomic<bool> dDone{false};
  HookedAgent d = hookedAgent(shared, "spareD", [&](const StoreOp& op) {
    if (op.call == "join" && op.key.ends_with("/vacancies")) ++dLooks;
  });
  auto fd = std::async(std::launch::async, [&] {
    d.link->beginCall("join");
    try {
      RoundResult r = d.rendezvous->next();
      dDone = true;
      return r;
    } catch (...) {
      dDone = true;
      throw;
    }
  });
  awaitArrivals(observer, "vac", 1, 1);
  {
    FirstChange lost(*a.rendezvous, "member lost");
    b.link->dropAll(true);
    lost.get();
  }
  std::vector<Vacancy> claimed = a.rendezvous->claimLostMembers();
  REQUIRE(claimed.size() == 1);
  std::atomic<int> counted{-1};
  std::atomic<bool> reached{false};
  // hostD takes its look now: woken, it reads the offers and goes back to its wait (or has a seat).
  auto letDLook = [&] {
    const int before = dLooks.load();
    observer.add(keys::status("vac", 1), 1);
    const Deadline bound(2s);
    while (!bound.expired() && !(dLooks.load() > before && (d.link->blockedInWatch() || dDone.load())))
      std::this_thread::sleep_for(1ms);
  };
  HookedAgent c = hookedAgent(shared, "spareC", [&](const StoreOp& op) {
    if (op.call != "join") return;
    if (counted.load() < 0 && op.key.ends_with("/vacancies") && observer.check({keys::vacancies("vac", 0)}))
      counted = 0;
    if (counted.load() >= 0 && counted.fetch_add(1) == point && !reached.exchange(true)) letDLook();
  });
  auto fc = std::async(std::launch::async, [&] {
    c.link->beginCall("join");
    return c.rendezvous->next();
  });
  awaitArrivals(observer, "vac", 1, 2);
  a.rendezvous->postVacancy(claimed[0], 1, 1);
  // Exactly one spare gets the place (whichever returns first); the other waits on.
  const Deadline takeBound(5s);
  auto ready = [](auto& f) { return f.wait_for(0ms) == std::future_status::ready; };
  while (!takeBound.expired() && !ready(fc) && !ready(fd)) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(300ms);  // the other, had it taken the place too, would have returned
  const bool cTook = ready(fc);
  const bool dTook = ready(fd);
  INFO("point " << point << ": hostC took " << cTook << ", hostD took " << dTook);
  CHECK(cTook != dTook);
  CHECK(keys::parseCounter(observer.tryGet(keys::replaced("vac", 0))).value_or(0) == 1);
  auto& winner = cTook ? fc : fd;
  auto& loser = cTook ? fd : fc;
  CHECK(getWithin(winner).nodeRank == rb.nodeRank);
  Rendezvous& member = cTook ? *c.rendezvous : *d.rendezvous;
  // The job ends with the winner as the lost member; the other spare learns it.
  CHECK(a.rendezvous->finish());
  CHECK(member.finish());
  a.rendezvous->leave();
  member.leave();
  observer.add(keys::status("vac", 1), 1);  // a wake: it reads the outcome now, not at its join timeout
  try {
    const RoundResult r = getWithin(loser);
    FAIL_CHECK("the other spare got round " << r.round << ", node rank " << r.nodeRank << " of " << r.nodeCount
                                            << ", generation " << r.generation << ", after the job ended");
  } catch (const JobEnded&) {
  }
  (cTook ? d : c).rendezvous->leave();
  CHECK(keys::parseCounter(observer.tryGet(keys::present("vac"))).value_or(0) == 0);
  return reached.load();
}

}  // namespace

TEST_CASE("vacancy interleavings: the claimer dies at each point of claiming and offering a lost member's place",
          "[rendezvous][vacancy][v2]") {
  int points = 0;
  for (int point = 0; point < 40 && claimerDiesAt(point); ++point) ++points;
  CHECK(points >= 4);  // the look at the members, the claim, the offer
}

TEST_CASE("vacancy interleavings: the spare dies at each point of taking a lost member's place",
          "[rendezvous][vacancy][v2]") {
  int points = 0;
  for (int point = 0; point < 40; ++point) {
    const PointOutcome outcome = spareDiesAt(point);
    if (!outcome.killed) break;  // past its last store operation: the place was taken whole
    ++points;
  }
  CHECK(points >= 5);  // the offers read, the taker's compare_set, the take's batch, the wake
}

TEST_CASE("vacancy interleavings: a second spare takes its look at each point of the first's take",
          "[rendezvous][vacancy][v2]") {
  int points = 0;
  for (int point = 0; point < 40 && spareRacesAt(point); ++point) ++points;
  CHECK(points >= 5);
}

TEST_CASE("vacancy interleavings: a spare whose join looks at the running round just as the job ends learns "
          "that it ended, and never forms a round alone",
          "[rendezvous][vacancy][v2]") {
  auto shared = MemoryStore::makeShared();
  HookedAgent a = hookedAgent(shared, "hostA", nullptr);
  HookedAgent b = hookedAgent(shared, "hostB", nullptr);
  auto fa = startNext(*a.rendezvous);
  auto fb = startNext(*b.rendezvous);
  REQUIRE(getWithin(fa).nodeCount == 2);
  getWithin(fb);
  // The spare reads the running round's offers (none) and the job ends right then: both
  // members finish and leave, which leaves no survivor of the running round to wait for.
  std::atomic<bool> ended{false};
  HookedAgent c = hookedAgent(shared, "spareC", [&](const StoreOp& op) {
    if (op.call != "join" || !op.key.ends_with("/0/vacancies") || ended.exchange(true)) return;
    CHECK(a.rendezvous->finish());
    CHECK(b.rendezvous->finish());
    a.rendezvous->leave();
    b.rendezvous->leave();
  });
  auto fc = std::async(std::launch::async, [&] {
    c.link->beginCall("join");
    return c.rendezvous->next();
  });
  try {
    const RoundResult r = getWithin(fc);
    FAIL_CHECK("the spare got round " << r.round << ", node rank " << r.nodeRank << " of " << r.nodeCount
                                      << ", after the job ended");
  } catch (const JobEnded& e) {
    CHECK(e.exitCode() == 0);
  }
  c.link->endCall();
  CHECK(ended.load());
}

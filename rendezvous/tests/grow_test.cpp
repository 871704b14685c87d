// A grow in place under --recovery in-process (docs/recovery.md "Elastic in place"; the store's
// side in rendezvous/src/vacancy_board.*): with a node waiting in the next round and the job below
// MAX, exactly one survivor claims the round's next grow, the place is at the end of the world
// (node rank = node count, rank offset = world size), exactly one waiting node takes it as a
// spare takes a lost member's place, the exit barrier waits for the member it adds, a grown
// member lost leaves a place of its own, one grow is open at a time, and a node that comes back
// after a shrink is announced (the job is below MAX again) and grows it back.
#include <catch2/catch.hpp>

#include "drun/rendezvous/keys.hpp"
#include "drun/rendezvous/recovery_keys.hpp"
#include "elastic_job.hpp"

using namespace drun::rdzv;
using namespace drun::rdzv::test;

TEST_CASE("grow: one survivor claims a grow for a waiting node, which takes node rank = node count and rank "
          "offset = world size, and the exit barrier waits for it",
          "[rendezvous][vacancy][grow]") {
  ElasticJob job(2, 3);
  REQUIRE(job.rounds[0].nodeCount == 2);
  auto c = job.newcomer("hostC");
  FirstChange waitingOnA(*job.members[0], "waiting");
  auto fc = startNext(*c);
  job.awaitWaiting(1);
  waitingOnA.get();  // announced: the job runs below MAX
  std::optional<Vacancy> byA = job.members[0]->claimGrowth(2, 2);
  std::optional<Vacancy> byB = job.members[1]->claimGrowth(2, 2);
  REQUIRE(byA.has_value() + byB.has_value() == 1);
  Rendezvous& claimer = byA ? *job.members[0] : *job.members[1];
  const Vacancy place = byA ? *byA : *byB;
  CHECK(place.nodeRank == 2);
  CHECK(place.rankOffset == 2);
  CHECK(place.localWorldSize == 1);
  CHECK(place.node == "hostC");
  CHECK_FALSE(claimer.claimGrowth(2, 2).has_value());  // one grow at a time

  claimer.postVacancy(place, /*generation=*/3, /*restartCount=*/0);
  const RoundResult took = getWithin(fc);
  CHECK(took.round == 0);
  checkPlace(took, 2, 2, 3, 3);
  CHECK(took.generation == 3);
  CHECK(took.storePrefix == job.rounds[0].storePrefix);
  REQUIRE(took.hosts.size() == 3);
  CHECK(took.hosts[2] == "hostC");
  CHECK(job.counter(keys::grown("job", 0)) == 1);
  CHECK(job.counter(keys::replaced("job", 0)) == 0);
  CHECK_FALSE(claimer.withdrawVacancy(place));  // taken first
  claimer.endGrowth(place);
  claimer.endGrowth(place);  // once only
  CHECK(job.counter(keys::grows("job", 0)) == 1);
  // At MAX now: no grow, whoever waits.
  auto d = job.newcomer("hostD");
  auto fd = startNext(*d);
  job.awaitWaiting(2);
  CHECK_FALSE(job.members[0]->claimGrowth(3, 3).has_value());

  // The exit barrier waits for the member the round grew by.
  FirstChange endOnA(*job.members[0], "succeeded");
  CHECK(job.members[0]->finish());
  CHECK(job.members[1]->finish());
  CHECK_FALSE(endOnA.reportedWithin(300ms));
  CHECK(c->finish());
  endOnA.get();
  for (Rendezvous* r : {job.members[0].get(), job.members[1].get(), c.get()}) r->leave();
  try {
    getWithin(fd);
    FAIL("the node waiting at MAX got a seat");
  } catch (const JobEnded& e) {
    CHECK(e.exitCode() == 0);
  }
  d->leave();
  CHECK(keysBesidesTombstone(job.cluster.store(), "job") == 0);
}

TEST_CASE("grow: a withdrawn grow place adds nobody, and the next grow is claimed only once the first ended",
          "[rendezvous][vacancy][grow]") {
  ElasticJob job(2, 3);
  auto c = job.newcomer("hostC");
  auto fc = startNext(*c);
  job.awaitWaiting(1);
  std::optional<Vacancy> first = job.members[0]->claimGrowth(2, 2);
  REQUIRE(first.has_value());
  CHECK_FALSE(job.members[1]->claimGrowth(2, 2).has_value());
  CHECK(job.members[0]->withdrawVacancy(*first));  // never posted, never taken
  CHECK_FALSE(job.members[1]->claimGrowth(2, 2).has_value());  // still open until its claimer ends it
  job.members[0]->endGrowth(*first);
  std::optional<Vacancy> second = job.members[1]->claimGrowth(2, 2);
  REQUIRE(second.has_value());
  CHECK(second->lostId != first->lostId);
  CHECK(second->nodeRank == 2);
  // Posted after it was withdrawn: nobody can take it.
  job.members[1]->withdrawVacancy(*second);
  job.members[1]->postVacancy(*second, 2, 0);
  CHECK_FALSE(fc.wait_for(300ms) == std::future_status::ready);
  job.members[1]->endGrowth(*second);
  CHECK(job.counter(keys::grown("job", 0)) == 0);
  CHECK(job.counter(keys::grows("job", 0)) == 2);
  // The barrier counts the decision's members only; the waiting node learns the job's end.
  FirstChange endOnA(*job.members[0], "succeeded");
  CHECK(job.members[0]->finish());
  CHECK(job.members[1]->finish());
  endOnA.get();
  job.members[0]->leave();
  job.members[1]->leave();
  try {
    getWithin(fc);
    FAIL("the waiting node took a withdrawn place");
  } catch (const JobEnded& e) {
    CHECK(e.exitCode() == 0);
  }
  c->leave();
}

TEST_CASE("grow: a grown member lost leaves a place of its own, at its node rank and ranks, which a spare "
          "takes with the grown world (its node rank past the decision's node count)",
          "[rendezvous][vacancy][grow]") {
  ElasticJob job(2, 3);
  MemoryStore* cHandle = nullptr;
  auto c = job.newcomer("hostC", &cHandle);
  auto fc = startNext(*c);
  job.awaitWaiting(1);
  std::optional<Vacancy> place = job.members[0]->claimGrowth(2, 2);
  REQUIRE(place.has_value());
  // As the grow's opener does: generation 1's world record keeps both nodes and adds one.
  const std::string prefix = keys::workerStore("job", 0);
  job.cluster.store().set(recovery::world(prefix, 1), recovery::encodeWorld({{0, 1}, {0, 1}, 1, 1}));
  job.cluster.store().set(recovery::generation(prefix), "1");
  job.members[0]->postVacancy(*place, 1, 0);
  REQUIRE(getWithin(fc).nodeRank == 2);
  job.members[0]->endGrowth(*place);
  auto d = job.newcomer("spareD");  // at MAX now: a spare
  auto fd = startNext(*d);
  job.awaitWaiting(2);
  {
    FirstChange lost(*job.members[1], "member lost");
    cHandle->closeForTest();
    CHECK_THAT(lost.get(), Catch::Contains("hostC"));
  }
  std::vector<Vacancy> claimed = job.members[1]->claimLostMembers();
  REQUIRE(claimed.size() == 1);
  CHECK(claimed[0].nodeRank == 2);
  CHECK(claimed[0].rankOffset == 2);
  CHECK(claimed[0].node == "hostC");
  CHECK(claimed[0].numberedIn == 1);  // numbered in the grow's generation, as its offer said
  CHECK_FALSE(keys::isGrowPlace(claimed[0].lostId));
  CHECK(job.members[0]->claimLostMembers().empty());

  job.cluster.store().set(recovery::generation(prefix), "2");
  job.members[1]->postVacancy(claimed[0], 2, 1);
  const RoundResult took = getWithin(fd);
  CHECK(took.generation == 2);
  checkPlace(took, 2, 2, 3, 3);
  REQUIRE(took.hosts.size() == 3);
  CHECK(took.hosts[0] == "hostA");
  CHECK(took.hosts[2] == "spareD");
  CHECK(job.counter(keys::replaced("job", 0)) == 1);
}

TEST_CASE("grow: after a shrink a node that comes back is announced (the job is below MAX again) and grows it "
          "back, and the exit barrier counts the dropped member and the grown one",
          "[rendezvous][vacancy][grow]") {
  ElasticJob job(3, 3);
  const Vacancy claimed = job.loseAndWithdraw(2, 0);
  CHECK(claimed.numberedIn == 0);  // a member of the decision: numbered as the roster is
  job.members[0]->dropMembers(1);
  // hostC comes back as a newcomer: 3 - 1 nodes run, below MAX: it is announced, not a spare.
  auto c = job.newcomer("hostC");
  FirstChange waitingOnB(*job.members[1], "waiting");
  auto fc = startNext(*c);
  waitingOnB.get();
  std::optional<Vacancy> place = job.members[1]->claimGrowth(2, 2);
  REQUIRE(place.has_value());
  job.members[1]->postVacancy(*place, 2, 1);
  const RoundResult took = getWithin(fc);
  CHECK(took.nodeRank == 2);
  CHECK(took.rankOffset == 2);
  CHECK(took.nodeCount == 3);
  CHECK(took.generation == 2);
  FirstChange endOnA(*job.members[0], "succeeded");
  CHECK(job.members[0]->finish());
  CHECK(job.members[1]->finish());
  CHECK_FALSE(endOnA.reportedWithin(300ms));  // 2 finished + 1 dropped of 3 + 1 grown
  CHECK(c->finish());
  endOnA.get();
  for (Rendezvous* r : {job.members[0].get(), job.members[1].get(), c.get()}) r->leave();
  CHECK(keysBesidesTombstone(job.cluster.store(), "job") == 0);
}

TEST_CASE("grow: a survivor lost after the grow was claimed and before the newcomer took its place is news to "
          "the newcomer (member lost): it re-forms with the others at once, not at recovery_timeout",
          "[rendezvous][vacancy][grow]") {
  ElasticJob job(2, 3);
  auto c = job.newcomer("hostC");
  FirstChange lostOnC(*c, "member lost");
  std::future<RoundResult> fc;
  {
    FirstChange waitingOnA(*job.members[0], "waiting");
    fc = startNext(*c);
    job.awaitWaiting(1);
    waitingOnA.get();  // announced: the job runs below MAX
  }
  std::optional<Vacancy> place = job.members[0]->claimGrowth(2, 2);
  REQUIRE(place.has_value());
  job.lose(1, 0);  // hostB lost before the place is offered
  job.members[0]->postVacancy(*place, /*generation=*/1, /*restartCount=*/0);
  checkPlace(getWithin(fc), 2, 2, 3, 3);
  REQUIRE(lostOnC.reportedWithin(5s));
  CHECK_THAT(lostOnC.get(), Catch::Contains("hostB"));
}

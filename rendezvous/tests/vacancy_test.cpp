// A lost member's place offered to a spare under --recovery in-process (docs/recovery.md "A lost
// node"; rendezvous/src/vacancy_board.*): one survivor claims each loss, exactly one spare takes
// the place (with the lost node's node rank and ranks, in the running round), a withdrawn place
// cannot be taken, the ledger counts the spare as the member it replaced (the exit barrier, a
// re-forming round), a spare lost in turn leaves a place of its own, and a withdrawn place the
// survivors shrink without (dropped) counts as finished in the exit barrier.
#include <catch2/catch.hpp>

#include "drun/rendezvous/keys.hpp"
#include "drun/rendezvous/recovery_keys.hpp"
#include "elastic_job.hpp"

using namespace drun::rdzv;
using namespace drun::rdzv::test;

namespace {

bool readyWithin(std::future<RoundResult>& f, std::chrono::milliseconds bound) {
  return f.wait_for(bound) == std::future_status::ready;
}

}  // namespace

TEST_CASE("vacancy: one survivor claims a lost member's place, exactly one of two spares takes it, "
          "and the job ends with the spare as that member",
          "[rendezvous][vacancy]") {
  ElasticJob job(3, 3);
  auto c = job.newcomer("spareC");
  auto d = job.newcomer("spareD");
  auto fc = startNext(*c);
  auto fd = startNext(*d);
  job.awaitWaiting(2);
  job.lose(1, 0);
  // Both survivors claim: the place is claimed by exactly one of them.
  std::vector<Vacancy> byA = job.members[0]->claimLostMembers();
  std::vector<Vacancy> byC = job.members[2]->claimLostMembers();
  REQUIRE(byA.size() + byC.size() == 1);
  Rendezvous& claimer = byA.empty() ? *job.members[2] : *job.members[0];
  const Vacancy v = byA.empty() ? byC[0] : byA[0];
  CHECK(v.round == 0);
  CHECK(v.nodeRank == job.rounds[1].nodeRank);
  CHECK(v.rankOffset == job.rounds[1].rankOffset);
  CHECK(v.node == "hostB");
  CHECK(claimer.claimLostMembers().empty());  // claimed once

  claimer.postVacancy(v, /*generation=*/4, /*restartCount=*/1);
  // Exactly one spare takes it.
  const bool cTook = readyWithin(fc, 5s) || !readyWithin(fd, 5s);
  auto& taker = cTook ? fc : fd;
  auto& other = cTook ? fd : fc;
  RoundResult took = getWithin(taker);
  CHECK(took.round == 0);
  checkPlace(took, job.rounds[1].nodeRank, job.rounds[1].rankOffset, 3, 3);
  CHECK(took.masterPort == job.rounds[0].masterPort);
  CHECK(took.storePrefix == job.rounds[0].storePrefix);
  CHECK(took.generation == 4);
  CHECK(took.generationRestartCount == 1);
  CHECK(took.hosts[size_t(took.nodeRank)] == (cTook ? "spareC" : "spareD"));
  CHECK_FALSE(readyWithin(other, 300ms));
  CHECK_FALSE(claimer.withdrawVacancy(v));  // taken first: the offer stays the spare's

  // The exit barrier counts the spare as the member it replaced.
  Rendezvous& spare = cTook ? *c : *d;
  FirstChange endOnA(*job.members[0], "succeeded");
  CHECK(job.members[0]->finish());
  CHECK(job.members[2]->finish());
  CHECK_FALSE(endOnA.reportedWithin(200ms));
  CHECK(spare.finish());
  endOnA.get();
  for (Rendezvous* r : {job.members[0].get(), job.members[2].get(), &spare}) r->leave();
  // The other spare learns the job's end (0) and leaves.
  try {
    getWithin(other);
    FAIL("the other spare got a seat");
  } catch (const JobEnded& e) {
    CHECK(e.exitCode() == 0);
  }
  (cTook ? d : c)->leave();
  CHECK(keysBesidesTombstone(job.cluster.store(), "job") == 0);
}

TEST_CASE("vacancy: a withdrawn place cannot be taken, and the survivors re-form with the spare",
          "[rendezvous][vacancy]") {
  ElasticJob job(2, 2);
  job.loseAndWithdraw(1, 0);
  auto c = job.newcomer("spareC");
  auto fc = startNext(*c);
  job.awaitWaiting(1);
  CHECK_FALSE(readyWithin(fc, 300ms));
  // The survivor re-forms (the restart path): round 1 takes the spare in.
  auto fa = startNext(*job.members[0]);
  std::vector<RoundResult> next = {getWithin(fa), getWithin(fc)};
  checkRound(next, {1, 1});
  CHECK(next[1].generation == 0);
}

TEST_CASE("vacancy: a spare lost after it took a place leaves a place of its own, and a re-forming "
          "round counts it as the member it replaced",
          "[rendezvous][vacancy]") {
  ElasticJob job(2, 2);
  MemoryStore* spareHandle = nullptr;
  auto c = job.newcomer("spareC", &spareHandle);
  auto fc = startNext(*c);
  job.awaitWaiting(1);
  job.lose(1, 0);
  std::vector<Vacancy> first = job.members[0]->claimLostMembers();
  REQUIRE(first.size() == 1);
  job.members[0]->postVacancy(first[0], 1, 1);
  RoundResult took = getWithin(fc);
  CHECK(took.nodeRank == job.rounds[1].nodeRank);

  SECTION("lost in turn: its own place, the same node rank") {
    FirstChange lostAgain(*job.members[0], "member lost");
    spareHandle->closeForTest();
    CHECK_THAT(lostAgain.get(), Catch::Contains("spareC"));
    std::vector<Vacancy> second = job.members[0]->claimLostMembers();
    REQUIRE(second.size() == 1);
    CHECK(second[0].lostId != first[0].lostId);
    CHECK(second[0].nodeRank == took.nodeRank);
    CHECK(second[0].node == "spareC");
  }
  SECTION("the job re-forms (a failure): the spare comes back as a member, nobody waits for the lost one") {
    FailureRecord f;
    f.node = "hostA";
    f.exitCode = 1;
    CHECK_FALSE(job.members[0]->reportFailure(f).final);
    auto fa = startNext(*job.members[0]);
    auto fc2 = startNext(*c);
    std::vector<RoundResult> next = {getWithin(fa), getWithin(fc2)};
    checkRound(next, {1, 1});
    CHECK(next[1].nodeRank == took.nodeRank);  // its node rank kept
  }
}

TEST_CASE("vacancy: a place whose claimer died stays claimed, and the other survivor claims the claimer's",
          "[rendezvous][vacancy]") {
  ElasticJob job(3, 3);
  job.lose(2, 1);
  std::vector<Vacancy> byA = job.members[0]->claimLostMembers();
  REQUIRE(byA.size() == 1);
  job.lose(0, 1);  // the claimer dies before it posts the place
  std::vector<Vacancy> byB = job.members[1]->claimLostMembers();
  REQUIRE(byB.size() == 1);
  CHECK(byB[0].node == "hostA");  // hostC's loss is hostA's claim: no second generation for it
}

TEST_CASE("vacancy: malformed offers are skipped, never taken", "[rendezvous][vacancy]") {
  ElasticJob job(2, 2);
  job.cluster.store().append(keys::vacancies("job", 0), "bogus-id\nnot an id!\n");
  job.cluster.store().set(keys::vacancy("job", 0, "bogus-id"), "x\ty");
  RendezvousOptions o = options(2, 2);
  o.maxRestarts = 2;
  o.joinTimeout = 300ms;
  auto c = job.cluster.agent(withNode(o, "spareC"));
  auto fc = startNext(*c);
  job.awaitWaiting(1);
  job.cluster.store().add(keys::status("job", 1), 1);  // a wake: the spare looks again
  CHECK_FALSE(readyWithin(fc, 300ms));
  for (auto& m : job.members) m->leave();
  CHECK_THROWS_AS(getWithin(fc), drun::TimeoutError);  // nobody left to replace: it gives up
}

TEST_CASE("vacancy: a place offered while the round is finishing: the spare that takes it finishes in "
          "the lost member's place and the job succeeds",
          "[rendezvous][vacancy]") {
  ElasticJob job(2, 2);
  auto c = job.newcomer("spareC");
  auto fc = startNext(*c);
  job.awaitWaiting(1);
  job.lose(1, 0);
  FirstChange end(*job.members[0], "succeeded");
  CHECK(job.members[0]->finish());  // hostA's workers succeeded: it waits in the exit barrier
  std::vector<Vacancy> claimed = job.members[0]->claimLostMembers();
  REQUIRE(claimed.size() == 1);
  job.members[0]->postVacancy(claimed[0], 1, 1);
  const RoundResult took = getWithin(fc);
  CHECK(took.nodeRank == job.rounds[1].nodeRank);
  CHECK_FALSE(end.reportedWithin(200ms));  // the lost member never finished: not yet
  CHECK(c->finish());
  end.get();
  job.members[0]->leave();
  c->leave();
  CHECK(keysBesidesTombstone(job.cluster.store(), "job") == 0);
}

TEST_CASE("vacancy: a withdrawn place the survivors shrink without: the exit barrier counts the dropped "
          "member as finished, whether the others finished before the drop or after",
          "[rendezvous][vacancy]") {
  for (const bool finishFirst : {false, true}) {
    DYNAMIC_SECTION((finishFirst ? "both survivors finished before the drop" : "the drop before they finished")) {
      ElasticJob job(3, 3);
      job.loseAndWithdraw(1, 0);
      FirstChange endOnA(*job.members[0], "succeeded");
      FirstChange endOnC(*job.members[2], "succeeded");
      if (finishFirst) {
        CHECK(job.members[0]->finish());
        CHECK(job.members[2]->finish());
        CHECK_FALSE(endOnA.reportedWithin(200ms));  // the lost member never finished: not yet
        job.members[0]->dropMembers(1);
      } else {
        job.members[0]->dropMembers(1);
        CHECK(job.members[0]->finish());
        CHECK_FALSE(endOnA.reportedWithin(200ms));  // hostC's workers run on
        CHECK(job.members[2]->finish());
      }
      endOnA.get();
      endOnC.get();
      job.members[0]->leave();
      job.members[2]->leave();
      CHECK(keysBesidesTombstone(job.cluster.store(), "job") == 0);
    }
  }
}

TEST_CASE("vacancy: the claimer lost right after it dropped a withdrawn place: a loss for the others, "
          "never a success",
          "[rendezvous][vacancy]") {
  ElasticJob job(3, 3);
  job.loseAndWithdraw(1, 0);
  job.members[0]->dropMembers(1);
  FirstChange lost(*job.members[2], "member lost");
  job.kill(0);
  lost.get();  // the survivor re-forms (the second loss), as during any recovery
  FirstChange end(*job.members[2], "succeeded");
  CHECK(job.members[2]->finish());
  CHECK_FALSE(end.reportedWithin(300ms));  // 1 finished + 1 dropped of 3: the claimer never finished
}

TEST_CASE("vacancy: after a shrink, a spare that takes a later lost member's place gets the shrunk world "
          "(node count, world size, its place renumbered), and the job ends with it",
          "[rendezvous][vacancy]") {
  ElasticJob job(3, 3);
  job.loseAndWithdraw(1, 0);  // hostB lost, generation 1 offered and withdrawn
  // hostA shrinks without it: as its agent does, generation 2's world record in the workers'
  // store keeps ranks and node ranks 0 and 2 (hostC becomes node rank 1, rank 1 of 2).
  const std::string prefix = keys::workerStore("job", 0);
  const recovery::World shrunk{{0, 2}, {0, 2}};
  job.cluster.store().set(recovery::world(prefix, 2), recovery::encodeWorld(shrunk));
  job.cluster.store().set(recovery::generation(prefix), "2");
  job.members[0]->dropMembers(1);

  auto d = job.newcomer("spareD");
  auto fd = startNext(*d);
  job.awaitWaiting(1);
  job.lose(2, 0);  // hostC lost: hostA claims its place, numbered as the decision's roster
  std::vector<Vacancy> claimed = job.members[0]->claimLostMembers();
  REQUIRE(claimed.size() == 1);
  Vacancy v = claimed[0];
  CHECK(v.node == "hostC");
  CHECK(v.nodeRank == 2);
  CHECK(v.numberedIn == 0);
  // The claimer renumbers the place through the worlds since (agent_node_recovery.cpp), then
  // opens generation 3 for it and offers it.
  const auto now = recovery::renumberPlace({v.nodeRank, v.rankOffset}, {shrunk});
  REQUIRE(now.has_value());
  v.nodeRank = now->nodeRank;
  v.rankOffset = now->rankOffset;
  v.numberedIn = 2;
  job.cluster.store().set(recovery::generation(prefix), "3");
  job.members[0]->postVacancy(v, /*generation=*/3, /*restartCount=*/1);

  const RoundResult took = getWithin(fd);
  CHECK(took.round == 0);
  CHECK(took.generation == 3);
  checkPlace(took, 1, 1, 2, 2);  // the shrunk world's, not the decision's 3
  REQUIRE(took.hosts.size() == 2);
  CHECK(took.hosts[0] == "hostA");
  CHECK(took.hosts[1] == "spareD");

  // The exit barrier: hostA and the spare finish, hostB was dropped.
  FirstChange endOnA(*job.members[0], "succeeded");
  CHECK(job.members[0]->finish());
  CHECK_FALSE(endOnA.reportedWithin(200ms));
  CHECK(d->finish());
  endOnA.get();
  job.members[0]->leave();
  d->leave();
  CHECK(keysBesidesTombstone(job.cluster.store(), "job") == 0);
}

TEST_CASE("vacancy: a survivor lost after a place was claimed and before a spare took it is news to the spare "
          "(member lost), the loss it replaces is not",
          "[rendezvous][vacancy]") {
  for (const bool secondLoss : {true, false}) {
    DYNAMIC_SECTION((secondLoss ? "hostB lost between the claim and the take" : "no loss after the claim")) {
      ElasticJob job(3, 3);
      job.lose(2, 0);  // hostC lost: hostA claims its place
      std::vector<Vacancy> claimed = job.members[0]->claimLostMembers();
      REQUIRE(claimed.size() == 1);
      if (secondLoss) job.lose(1, 0);  // hostA re-forms on it; the spare must too, at once
      job.members[0]->postVacancy(claimed[0], /*generation=*/1, /*restartCount=*/1);
      auto d = job.newcomer("spareD");
      FirstChange lostOnD(*d, "member lost");
      auto fd = startNext(*d);
      checkPlace(getWithin(fd), job.rounds[2].nodeRank, job.rounds[2].rankOffset, 3, 3);
      if (secondLoss) {
        REQUIRE(lostOnD.reportedWithin(5s));
        CHECK_THAT(lostOnD.get(), Catch::Contains("hostB"));
      } else {
        CHECK_FALSE(lostOnD.reportedWithin(300ms));
      }
    }
  }
}

// In-process recoveries spend the job's restart budget (Rendezvous::spendRecovery): one unit
// each, counted for the job (in memory on one node, the round's `recoveries` counter on c10d),
// taken off again when a recovery falls back (the restart it becomes is paid by it), and added
// to the next round's restart count.
#include <catch2/catch.hpp>

#include "c10d_test_support.hpp"
#include "drun/rendezvous/keys.hpp"

using namespace drun::rdzv;
using namespace drun::rdzv::test;

TEST_CASE("c10d: recoveries spend the job's budget and count in the next round's restart count",
          "[rendezvous]") {
  MemoryCluster cluster;
  auto [a, b] = runningPair(cluster, /*maxRestarts=*/2);
  CHECK(a->spendRecovery() == std::optional<int>(1));
  CHECK(b->spendRecovery() == std::optional<int>(2));  // the job's count: every node the same
  CHECK_FALSE(a->spendRecovery());                      // spent; nothing else counted
  CHECK(keys::parseCounter(cluster.store().tryGet(keys::recoveries("job", 0))) == 2);
  // The second recovery fell back: its unit pays for the restart its failure asks for.
  b->refundRecovery();
  FailureRecord f;
  f.rank = 1;
  f.node = "hostB";
  f.exitCode = 3;
  CHECK_FALSE(b->reportFailure(f).final);
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  std::vector<RoundResult> second = {getWithin(fa), getWithin(fb)};
  for (const auto& r : second) CHECK(r.restartCount == 2);  // one recovery + one restart
  CHECK_FALSE(a->spendRecovery());
  CHECK(b->reportFailure(f).final);
}

TEST_CASE("one node: recoveries spend the budget in memory and count in the next round", "[rendezvous]") {
  RendezvousOptions o;
  o.maxRestarts = 2;
  auto single = makeSingleNodeRendezvous(o);
  CHECK(single->next().restartCount == 0);
  CHECK(single->spendRecovery() == std::optional<int>(1));
  CHECK(single->spendRecovery() == std::optional<int>(2));
  CHECK_FALSE(single->spendRecovery());
  FailureRecord f;
  CHECK(single->reportFailure(f).final);  // the budget is spent: the failure ends the job
  single->refundRecovery();               // unless a recovery fell back: it pays for the restart
  CHECK_FALSE(single->reportFailure(f).final);
  CHECK(single->next().restartCount == 2);
}

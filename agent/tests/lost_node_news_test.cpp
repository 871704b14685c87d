// A survivor's view of a lost member node under --recovery in-process (lost_node_news.hpp): the
// orders in which the loss and the generation opened for it can reach a node that did not claim
// it, and what each order comes to at recovery_timeout.
#include <catch2/catch.hpp>

#include "lost_node_news.hpp"

using namespace drun::agent::detail;

namespace {

LossSeen inProcess() {
  LossSeen seen;
  seen.inProcess = true;
  return seen;
}

}  // namespace

TEST_CASE("lost node news: under --recovery restart a loss stops the workers", "[recovery]") {
  LossSeen seen;
  seen.running = true;
  CHECK_FALSE(classifyLoss(seen).keepWorkers);
}

TEST_CASE("lost node news: the loss first, then the claimer's generation: its recovery began once the "
          "generation arrives, not before", "[recovery]") {
  LossSeen seen = inProcess();
  seen.running = true;
  const LossNews news = classifyLoss(seen);
  CHECK(news.keepWorkers);
  CHECK(news.itsGeneration == 0);
  CHECK_FALSE(lossRecoveryBegan(news, 0, 0));  // the claimer died before it opened one: re-form
  CHECK(lossRecoveryBegan(news, 0, 1));
}

TEST_CASE("lost node news: after an earlier recovery formed, a loss waits for a newer generation", "[recovery]") {
  LossSeen seen = inProcess();
  seen.running = true;
  seen.newest = 1;
  seen.newestForLostNode = true;  // the earlier recovery was a lost node's too: formed, done
  const LossNews news = classifyLoss(seen);
  CHECK(news.keepWorkers);
  CHECK(news.itsGeneration == 0);
  CHECK_FALSE(lossRecoveryBegan(news, 1, 1));
  CHECK(lossRecoveryBegan(news, 1, 2));
}

// The claimer (another survivor) claimed the loss and opened generation 1 before this node's
// membership watcher reported it; the claimer opens generation 2 (the shrink) at its own deadline,
// which can come after this node's. The recovery of the loss began with generation 1: at this
// node's deadline it must not re-form (it would stop its workers, and the shrink's generation
// would then fall back for want of them: "ranks 2, 3 never joined").
TEST_CASE("lost node news: the claimer's generation first, then the loss: its recovery began, whether or not "
          "the shrink came before this node's deadline", "[recovery]") {
  LossSeen seen = inProcess();
  seen.recovering = true;
  seen.newest = 1;
  seen.newestForLostNode = true;
  const LossNews news = classifyLoss(seen);
  CHECK(news.keepWorkers);
  CHECK(news.itsGeneration == 1);
  CHECK(lossRecoveryBegan(news, 1, 1));  // the shrink not opened yet
  CHECK(lossRecoveryBegan(news, 1, 2));
}

TEST_CASE("lost node news: a loss while another recovery is open re-forms", "[recovery]") {
  LossSeen seen = inProcess();
  seen.recovering = true;
  seen.newest = 1;
  SECTION("a worker's generation") { CHECK_FALSE(classifyLoss(seen).keepWorkers); }
  SECTION("a lost node's recovery open here already: a second loss") {
    seen.newestForLostNode = true;
    seen.lossOpen = true;
    CHECK_FALSE(classifyLoss(seen).keepWorkers);
  }
}

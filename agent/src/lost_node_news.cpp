#include "lost_node_news.hpp"

namespace drun::agent::detail {

LossNews classifyLoss(const LossSeen& seen) {
  LossNews news;
  if (!seen.inProcess) return news;
  if (seen.running) {
    news.keepWorkers = true;
    return news;
  }
  // A second loss while one is open here re-forms; the first one's generation arriving first
  // does not make its loss a second one: that generation is the loss's, begun already.
  news.keepWorkers = seen.recovering && !seen.lossOpen && seen.newest > 0 && seen.newestForLostNode;
  if (news.keepWorkers) news.itsGeneration = seen.newest;
  return news;
}

// Only a generation that began is waited for: the loss's own, or any newer than the newest when
// the loss came. Once the loss's generation began, its claimer decides it (formed, shrunk, or
// fallen back); the claimer's death after that is a loss of its own.
bool lossRecoveryBegan(const LossNews& news, uint64_t newestAtLoss, uint64_t newestNow) {
  return news.itsGeneration > 0 || newestNow > newestAtLoss;
}

}  // namespace drun::agent::detail

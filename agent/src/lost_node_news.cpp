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
  // does not make its loss a second one.
  news.keepWorkers = seen.recovering && !seen.lossOpen && seen.newest > 0 && seen.newestForLostNode;
  return news;
}

bool lossRecoveryBegan(const LossNews& news, uint64_t newestAtLoss, uint64_t newestNow) {
  (void)news;
  return newestNow > newestAtLoss;
}

}  // namespace drun::agent::detail

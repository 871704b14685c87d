// How a survivor under --recovery in-process takes the loss of a member node (docs/recovery.md "A
// lost node"), and, at recovery_timeout from the loss, whether a recovery of it began (else the
// node re-forms: the claimer died before it opened a generation).
//
// The generation another survivor opened for the loss (its lost ranks recorded without a pid)
// may reach this node before its own membership watcher reports the loss: the loss is then that
// generation's, and its recovery began already. The claimer opens the next generation (the
// shrink, or the fallback) only at its own deadline, which may come after this node's: that
// generation is not what this node waits for.
#pragma once

#include <cstdint>

namespace drun::agent::detail {

// What the agent knows when a member's loss reaches it.
struct LossSeen {
  bool inProcess = false;          // --recovery in-process
  bool running = false;            // the agent is Running
  bool recovering = false;         // the agent is Recovering
  bool lossOpen = false;           // a lost node's recovery is open on this node already
  uint64_t newest = 0;             // the newest generation this node knows of
  bool newestForLostNode = false;  // it was opened for lost nodes (every lost rank without a pid)
};

struct LossNews {
  bool keepWorkers = false;    // claim the loss, the workers go on (NodeLost); else stop and re-form
  uint64_t itsGeneration = 0;  // the generation opened for the loss, begun before the loss came (0: none)
};

LossNews classifyLoss(const LossSeen& seen);

// At recovery_timeout from the loss: whether a recovery of it began, `newestAtLoss` the newest
// generation when the loss came, `newestNow` the newest now.
bool lossRecoveryBegan(const LossNews& news, uint64_t newestAtLoss, uint64_t newestNow);

}  // namespace drun::agent::detail

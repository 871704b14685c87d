#include "exit_barrier.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

#include "drun/common/error.hpp"

namespace drun::rdzv {

// An outcome with nobody present is what an ended run left behind (its last node died before
// removing the keys, or this start came right after it): one new start, elected by compare_set on
// `outcome`, removes the keys; the others wait until it has. An outcome while nodes are present:
// they are leaving (the store's host serves until they have), waited for at most close_timeout,
// then a clear error (never a reset under live nodes). An outcome before any round of the job
// closed is stale or forged (no job ended that never formed): removed and not believed.
void ExitBarrier::enter(LivenessStore& store, const Deadline& deadline) {
  if (present_) return;
  const std::string& id = node_.runId();
  const RendezvousOptions& o = node_.options;
  const std::string outcomeKey = keys::outcome(id);
  const std::string presentKey = keys::present(id);
  std::optional<Deadline> leaving;
  for (;;) {
    auto outcome = store.tryGet(outcomeKey);
    if (!outcome) break;
    // A node of this job that lost the store and came back: the job ended while it was away.
    if (cameBack_) throwIfJobEnded(store);
    if (keys::parseCounter(store.tryGet(keys::currentRound(id))).value_or(0) == 0) {
      spdlog::warn("rendezvous '{}': ignoring a job outcome written before any round closed", id);
      store.deleteKey(outcomeKey);
      break;
    }
    if (deadline.expired())
      throw TimeoutError("rendezvous '" + id + "': an earlier run with this id ended and was not " +
                         "cleared within " + ms(o.joinTimeout));
    const milliseconds slice = std::min(deadline.remaining(), o.readTimeout);
    if (keys::isOutcomeReset(*outcome)) {
      watchQuietly(store, outcomeKey, outcome, slice);
      continue;
    }
    auto present = store.tryGet(presentKey);
    const int64_t stillHere = keys::parseCounter(present).value_or(0);
    if (stillHere > 0) {
      if (!leaving) {
        leaving.emplace(o.closeTimeout);
        spdlog::info("rendezvous '{}': an earlier run with this id ended; waiting for its {} "
                     "node(s) to leave", id, stillHere);
      }
      if (leaving->expired())
        throw Error("rendezvous '" + id + "': an earlier run with this id ended, and " +
                    std::to_string(stillHere) + " of its node(s) are still attached after " +
                    ms(o.closeTimeout) + "; wait for them to exit, or use another --rdzv-id");
      watchQuietly(store, presentKey, present, std::min(slice, leaving->remaining()));
      continue;
    }
    const std::string claim = keys::encodeOutcomeReset(node_.self.id);
    if (store.compareSet(outcomeKey, *outcome, claim) == claim) {
      removeJobKeys(store);
      store.deleteKey(keys::currentRound(id));  // the tombstone, claim included
      store.deleteKey(outcomeKey);
      spdlog::info("rendezvous '{}': an earlier run with this id ended; starting afresh", id);
      break;
    }
  }
}

std::optional<size_t> ExitBarrier::countIn(StoreBatch& batch) const {
  if (present_) return std::nullopt;
  return batch.add(keys::present(node_.runId()), 1);
}

// Each step is one batch (one round trip to a TCP store, one transaction on etcd): the exit of a
// job is on the critical path of its end (scripts/bench/recovery.sh exit).
// The round's `ending` is claimed in the same batch as the count (no round trip more): a member
// that took waiting nodes in first (claimScaleUp) makes this node re-form with it. Its count
// stays, but counts nothing: `finished` is only read in a round whose ending is "finish"
// (JobLedger::everyMemberFinished, leave()).
bool ExitBarrier::finish(LivenessStore& store, uint64_t round, int64_t nodeCount) {
  const std::string& id = node_.runId();
  StoreBatch counted;
  const size_t claim = counted.compareSet(keys::ending(id, round), "",
                                          keys::encodeEnding(keys::RoundEnding::Finish));
  const size_t done = counted.add(keys::finished(id, round), 1);
  const size_t dropped = counted.tryGet(keys::dropped(id, round));
  const size_t grown = counted.tryGet(keys::grown(id, round));
  store.runBatch(counted);
  if (keys::parseEnding(counted.value(claim)) == keys::RoundEnding::ScaleUp) {
    spdlog::info("rendezvous '{}': a member of round {} took waiting node(s) in before this "
                 "node's workers succeeded: re-forming with it", id, round);
    return false;
  }
  // The last member to finish records the job's success first (a watcher may see the count
  // before: the sooner it is written, the smaller the window in which a node cut off comes back
  // to find no outcome). From here on this node's death is no loss (a will that counted `lost`
  // would send the others back to re-run what succeeded). Dying between the count and the will:
  // a spurious re-form at worst; the other order could leave the job neither finished nor told.
  // Then the watchers look (they read the counter itself).
  StoreBatch told;
  std::optional<size_t> status;
  // Members the round shrank without count as finished (they have no workers left to finish);
  // members it grew by must finish as the decision's do.
  const int64_t without = keys::parseCounter(counted.value(dropped)).value_or(0);
  const int64_t added = keys::parseCounter(counted.value(grown)).value_or(0);
  if (counted.number(done) + without >= nodeCount + added) status = addOutcome(told, round, std::nullopt);
  told.setWill(keys::finishedWill(id, round, node_.self.id, node_.self.displayName()));
  told.add(keys::changes(id, round), 1);
  runBumpingStatus(store, told, status);
  return true;
}

bool ExitBarrier::claimScaleUp(LivenessStore& store, uint64_t round) {
  const std::string scaleUp = keys::encodeEnding(keys::RoundEnding::ScaleUp);
  return keys::parseEnding(store.compareSet(keys::ending(node_.runId(), round), "", scaleUp)) ==
         keys::RoundEnding::ScaleUp;
}

void ExitBarrier::publishOutcome(LivenessStore& store, uint64_t round,
                                 const std::optional<FailureRecord>& failure) {
  StoreBatch told;
  const size_t status = addOutcome(told, round, failure);
  runBumpingStatus(store, told, status);
}

size_t ExitBarrier::addOutcome(StoreBatch& batch, uint64_t round,
                               const std::optional<FailureRecord>& failure) const {
  batch.compareSet(keys::outcome(node_.runId()), "", keys::encodeOutcome(failure));
  return batch.add(keys::status(node_.runId(), round + 1), 1);
}

// An add to a status that holds a decision by now (that round closed meanwhile) is refused, and
// no failure (bumpStatus): the round's waiters have their answer.
void ExitBarrier::runBumpingStatus(LivenessStore& store, StoreBatch& batch,
                                   std::optional<size_t> statusOp) {
  try {
    store.runBatch(batch);
  } catch (const InvalidArgument&) {
    for (size_t i = 0; i < batch.size(); ++i)
      if (i != statusOp && !batch.ok(i)) (void)batch.value(i);  // rethrows its own failure
  }
}

void ExitBarrier::throwIfJobEnded(LivenessStore& store) {
  const std::string& id = node_.runId();
  auto outcome = store.tryGet(keys::outcome(id));
  if (!outcome || keys::isOutcomeReset(*outcome)) return;
  auto failure = keys::parseOutcome(*outcome);
  if (!failure)
    throw JobEnded("rendezvous '" + id + "': the job finished (every worker succeeded) while " +
                   "this node waited to join it", 0);
  throw JobEnded("rendezvous '" + id + "': the job failed while this node waited to join it: " +
                     "rank " + std::to_string(failure->rank) + " on " + failure->node +
                     " ended with status " + std::to_string(failure->statusCode()),
                 failure->statusCode());
}

void ExitBarrier::leave(LivenessStore& store, std::optional<uint64_t> lastRound, int64_t nodeCount,
                        const StoreServer* hosted) {
  const std::string& id = node_.runId();
  // No loss (a clean leave), but still counted in `present` by a will: a cut from here on counts
  // this node out once, by that will or by the last batch (whole or not at all). In the batch
  // that reads whether every member finished (one round trip, one etcd transaction).
  StoreBatch look;
  look.setWill(presenceWill());
  std::optional<size_t> finished, dropped, grown, ending, outcome;
  if (lastRound) {
    finished = look.tryGet(keys::finished(id, *lastRound));
    dropped = look.tryGet(keys::dropped(id, *lastRound));
    grown = look.tryGet(keys::grown(id, *lastRound));
    ending = look.tryGet(keys::ending(id, *lastRound));
    outcome = look.tryGet(keys::outcome(id));
  }
  store.runBatch(look);
  // Every member finished, and the one that made it so died before recording it: recorded here,
  // so that a node coming back (cut off in the barrier) learns the job succeeded.
  if (lastRound && keys::parseEnding(look.value(*ending)) == keys::RoundEnding::Finish &&
      keys::parseCounter(look.value(*finished)).value_or(0) + keys::parseCounter(look.value(*dropped)).value_or(0) >=
          nodeCount + keys::parseCounter(look.value(*grown)).value_or(0) &&
      !look.value(*outcome))
    store.compareSet(keys::outcome(id), "", keys::encodeOutcome(std::nullopt));
  // The will cleared first (cut short there, the batch leaves a leak, never a -2), then `left`
  // of the last round counted, the watchers woken (they look again: a job that ended, they end)
  // and this node out of `present`: one batch.
  StoreBatch out;
  out.setWill({});
  if (lastRound) {
    out.add(keys::left(id, *lastRound), 1);
    out.add(keys::changes(id, *lastRound), 1);
  }
  std::optional<size_t> counted;
  if (present_) counted = out.add(keys::present(id), -1);
  present_ = false;
  store.runBatch(out);
  if (!counted) return;
  if (out.number(*counted) <= 0)
    removeJobKeys(store);
  else if (hosted)
    waitForOthersToLeave(store);
  if (hosted) serveLostNodes(*hosted);
}

void ExitBarrier::serveAfterOwnLoss(const std::function<std::unique_ptr<LivenessStore>()>& connect,
                                    const StoreServer& hosted) {
  if (!connect) return;
  try {
    auto store = connect();
    waitForOthersToLeave(*store);
    serveLostNodes(hosted);
  } catch (const std::exception& e) {
    spdlog::debug("rendezvous '{}': leave, serving the others: {}", node_.runId(), e.what());
  }
}

// Everything but `outcome`, `round` and the history, which stay as the job's tombstone (an
// outcome with a round is one of a job that formed; the store lets them go after
// etcd_history_ttl where it keeps keys past the job, expireEndedJob): a node that was cut off and
// comes back learns how the job ended (JobEnded) instead of waiting alone in a fresh round; a
// new start finds it with nobody present and resets it. Rounds older than the current one less
// two are gone already (RoundCloser::forgetRound); a spare waits at most one round ahead.
void ExitBarrier::removeJobKeys(LivenessStore& store) {
  const std::string& id = node_.runId();
  try {
    StoreBatch look;
    const size_t round = look.tryGet(keys::currentRound(id));
    const size_t outcome = look.tryGet(keys::outcome(id));
    store.runBatch(look);
    const uint64_t current = keys::parseCounter(look.value(round)).value_or(0);
    StoreBatch drop;
    for (uint64_t r = current > 3 ? current - 3 : 0; r <= current + 2; ++r)
      drop.deletePrefix(keys::round(id, r));
    for (const std::string& key : {keys::config(id), keys::present(id)}) drop.deleteKey(key);
    if (!look.value(outcome)) drop.deleteKey(keys::currentRound(id));
    store.runBatch(drop);
    int64_t n = 0;
    for (size_t i = 0; i < drop.size(); ++i) n += drop.number(i);
    spdlog::debug("rendezvous '{}': last node out, removed {} key(s)", id, n);
    store.expireEndedJob(keys::job(id), node_.options.etcdHistoryTtl);
  } catch (const Error& e) {
    spdlog::debug("rendezvous '{}': keys left in the store: {}", id, e.what());
  }
}

void ExitBarrier::waitForOthersToLeave(LivenessStore& store) {
  const Deadline deadline(node_.options.closeTimeout);
  const std::string key = keys::present(node_.runId());
  for (;;) {
    auto value = store.tryGet(key);
    const int64_t remaining = keys::parseCounter(value).value_or(0);
    if (!value || remaining <= 0) return;  // absent: the last one removed the job's keys
    if (deadline.expired()) {
      spdlog::info("rendezvous '{}': stopping the store with {} node(s) still attached after {}",
                   node_.runId(), remaining, ms(node_.options.closeTimeout));
      return;
    }
    watchQuietly(store, key, value, deadline.remaining());
  }
}

// A node counted out of `present` by its will may be alive: its lease expired (a stopped
// process; a cut link, whose TCP retransmissions back off past the cut itself), or it closed a
// connection that answered nothing within its read limit (this process was stopped). Back, it
// connects again and asks how the job ended (JobEnded, after forget()). With the store gone it
// could only exit 1 "lost the store", which fails a job that succeeded (under SLURM, its step).
// So the store stays up heartbeat_timeout past the last will that ran (by then such a node found
// its connection closed, and it connects again at once), at most close_timeout more.
void ExitBarrier::serveLostNodes(const StoreServer& hosted) const {
  const Deadline deadline(node_.options.closeTimeout);
  bool said = false;
  for (;;) {
    const auto lost = hosted.lastWillRun();
    if (!lost) return;
    const Clock::time_point until = *lost + node_.options.heartbeatTimeout;
    if (Clock::now() >= until) return;
    if (deadline.expired()) {
      spdlog::info("rendezvous '{}': stopping the store {} after the nodes left, with a node lost "
                   "without leaving not back", node_.runId(), ms(node_.options.closeTimeout));
      return;
    }
    if (!said)
      spdlog::info("rendezvous '{}': serving the store until {} after the last node lost "
                   "without leaving: it may come back to learn how the job ended",
                   node_.runId(), ms(node_.options.heartbeatTimeout));
    said = true;
    std::this_thread::sleep_until(std::min(until, Clock::now() + deadline.remaining()));
  }
}

}  // namespace drun::rdzv

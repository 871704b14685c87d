#include "membership_watcher.hpp"

#include <spdlog/spdlog.h>

#include <mutex>
#include <thread>

#include "drun/common/error.hpp"
#include "drun/common/parked_threads.hpp"
#include "drun/common/safe_text.hpp"
#include "drun/rendezvous/keys.hpp"
#include "job_ledger.hpp"

namespace drun::rdzv {
namespace {

using Kind = JobEvent::Kind;

void fire(EventSlot& slot, const std::atomic<bool>& stopped, const JobEvent& event) {
  std::lock_guard lock(slot.mutex);
  if (stopped.load() || !slot.callback) return;
  try {
    slot.callback(event);
  } catch (...) {
    // The callback is the owner's; nothing here could report its failure (see run()), and an
    // exception must not end this thread, nor be taken for a lost store.
  }
}

// What has been reported so far, so that each happening is reported once.
struct Reported {
  bool failed = false;
  int64_t gone = 0;     // wills counted (members lost and non-members that died)
  int64_t waiting = 0;
};

// A single new will whose node is not a member of the round (a spare or a joiner the closer did
// not take, that died before it registered its will for the next round) is no loss: no member
// has an assignment under another node's id. Only a will that is alone since the last look is
// checked (last_dead names the latest will, and `lost` unchanged around the read says no other
// came in between); two or more at once are reported, so a member's loss is never hidden.
bool lonelyNonMemberDeath(LivenessStore& store, const WatchedRound& w, int64_t lostRead) {
  auto dead = store.tryGet(keys::lastDead(w.runId, w.round));
  const int64_t lostAgain =
      keys::parseCounter(store.tryGet(keys::lost(w.runId, w.round))).value_or(0);
  if (!dead || lostAgain != lostRead || !keys::isValidNodeId(*dead)) return false;
  // The assignments exist only when the closer published them (one multi_set with the host
  // list): a closer that died after deciding leaves none, and then nobody can be told apart.
  return store.check({keys::hosts(w.runId, w.round)}) &&
         !store.check({keys::assign(w.runId, w.round, *dead)});
}

// Reads the round's job state after a change; fires what is new.
void classify(LivenessStore& store, const WatchedRound& w, Reported& seen, EventSlot& slot,
              const std::atomic<bool>& stopped) {
  auto event = [&](Kind kind, std::string reason) {
    JobEvent e;
    e.kind = kind;
    e.round = w.round;
    e.reason = std::move(reason);
    return e;
  };
  const JobLedger ledger = readLedger(store, {w.runId, w.round, w.nodeCount, w.leftAtClose});
  if (!seen.failed && ledger.failed) {
    if (auto record = store.tryGet(keys::failure(w.runId, w.round))) {
      seen.failed = true;
      JobEvent e = event(Kind::Failed, "a worker failed");
      try {
        e.failure = keys::parseFailure(*record);
      } catch (const Error& error) {
        // A corrupt record still means a failure: end the job with what is known.
        FailureRecord unknown;
        unknown.node = "unknown";
        unknown.exitCode = 1;
        unknown.final = true;
        unknown.detailSource = "store";
        unknown.detail = error.what();
        e.failure = unknown;
      }
      fire(slot, stopped, e);
      return;  // a failure decides the round: later happenings are its consequences
    }
  }
  if (ledger.everyMemberFinished()) {
    // Reported at every look, not once: it is the job's last word, and an agent that missed it
    // must not wait in the barrier for ever (extra ones are ignored once the agent is done).
    fire(slot, stopped, event(Kind::Succeeded, "every node's workers succeeded"));
    return;
  }
  // Losses only (wills): a member that left cleanly (its job ended) is not news.
  const int64_t gone = ledger.membersLost();
  if (gone == seen.gone + 1 && lonelyNonMemberDeath(store, w, ledger.lost)) {
    seen.gone = gone;
    return;
  }
  if (gone <= seen.gone && ledger.waiting <= seen.waiting) return;
  // Written by any client of the store (a will's text): printed, so made printable first.
  const std::string reason = text::printable(
      store.tryGet(keys::lastChange(w.runId, w.round))
          .value_or("the membership of round " + std::to_string(w.round) + " changed"),
      {512});
  if (gone > seen.gone) {
    seen.gone = gone;
    seen.waiting = std::max(seen.waiting, ledger.waiting);  // re-forming takes them in too
    fire(slot, stopped, event(Kind::MemberLost, reason));
  } else {
    seen.waiting = ledger.waiting;
    fire(slot, stopped, event(Kind::NodeWaiting, reason));
  }
}

// The job's outcome, read at every look: it is the job's last word, and this round's ledger may
// never show it. The last node out removes the round's keys (`outcome` stays as the tombstone),
// and a round can form after the job succeeded (its members re-formed while the last member of
// the round before finished it) and never finish: a member waiting in its exit barrier would
// wait for ever. Reported as the ledger reports success: at every look, and at the end of every
// quiet watch slice (a round that never changes again).
void classifyOutcome(LivenessStore& store, const WatchedRound& w, Reported& seen,
                          EventSlot& slot, const std::atomic<bool>& stopped) {
  auto outcome = store.tryGet(keys::outcome(w.runId));
  if (!outcome || keys::isOutcomeReset(*outcome)) return;
  JobEvent e;
  e.round = w.round;
  try {
    e.failure = keys::parseOutcome(*outcome);
  } catch (const Error& error) {
    spdlog::debug("rendezvous '{}': unreadable outcome: {}", w.runId, error.what());
    return;  // not taken for a success; the agent's own deadlines end its wait
  }
  if (!e.failure) {
    e.kind = Kind::Succeeded;
    e.reason = "every node's workers succeeded (the job's outcome)";
  } else {
    if (seen.failed) return;
    seen.failed = true;
    e.kind = Kind::Failed;
    e.reason = "a worker failed (the job's outcome)";
  }
  fire(slot, stopped, e);
}

void storeLost(const WatchedRound& w, EventSlot& slot, const std::atomic<bool>& stopped,
               const std::string& why) {
  JobEvent lost;
  lost.kind = Kind::StoreLost;
  lost.round = w.round;
  lost.reason = "lost the rendezvous store at " + w.endpoint + ": " + why;
  fire(slot, stopped, lost);
}

void run(LivenessStore& store, const WatchedRound& w, EventSlot& slot, std::atomic<bool>& stopped) {
  const std::string changesKey = keys::changes(w.runId, w.round);
  std::optional<Bytes> known;
  if (w.changesAtClose > 0) known = std::to_string(w.changesAtClose);
  Reported seen;
  seen.gone = w.lostSeen;
  try {
    while (!stopped.load()) {
      bool changed = true;
      try {
        known = store.watch(changesKey, known, w.slice);
      } catch (const TimeoutError&) {
        changed = false;  // the server answered at the deadline: the connection is alive
      }
      if (stopped.load()) return;
      if (changed) classify(store, w, seen, slot, stopped);
      // After a quiet slice too: the job may have ended in a later round (its members re-formed
      // while this node waited in the exit barrier), and this round never changes again.
      classifyOutcome(store, w, seen, slot, stopped);
    }
  } catch (const std::exception& e) {
    // No logging here: this thread may outlive the process' loggers (it is detached); the
    // reason goes to the callback, whose owner reports it.
    storeLost(w, slot, stopped, e.what());
  } catch (...) {
    storeLost(w, slot, stopped, "unknown error");
  }
}

}  // namespace

MembershipWatcher::MembershipWatcher(std::unique_ptr<LivenessStore> store, WatchedRound round,
                                     std::shared_ptr<EventSlot> slot)
    : slot_(std::move(slot)),
      stopped_(std::make_shared<std::atomic<bool>>(false)),
      store_(std::move(store)) {
  thread_ = OwnedThread("membership watcher", [store = store_, round = std::move(round),
                                                slot = slot_, stopped = stopped_]() mutable {
    run(*store, round, *slot, *stopped);
    store.reset();  // its last words (a closed connection logs) before the thread counts as ended
  });
}

MembershipWatcher::~MembershipWatcher() {
  stopped_->store(true);
  store_->interrupt();  // its blocked watch returns now; `stopped` keeps it from reporting
  std::lock_guard lock(slot_->mutex);  // waits out a callback in progress
  parkUntilExit(std::move(thread_));   // it ends at once; joined later, never waited for here
}

}  // namespace drun::rdzv

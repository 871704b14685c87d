#include "round_join.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>

#include "drun/common/error.hpp"
#include "drun/common/progress.hpp"
#include "drun/store/store_batch.hpp"
#include "store_refill.hpp"
#include "vacancy_board.hpp"

namespace drun::rdzv {
namespace {

// The delay of a backup closer (a joiner that did not arm the last call) behind the armer, so
// that normally exactly one node evaluates the close.
milliseconds backupMargin(milliseconds lastCall) {
  return std::max<milliseconds>(100ms, lastCall / 10);
}

using P = JoinPhase;

}  // namespace

const char* toString(JoinPhase phase) {
  switch (phase) {
    case P::Joining: return "Joining";
    case P::LastCall: return "LastCall";
    case P::Replacing: return "Replacing";
    case P::Decided: return "Decided";
    case P::NotTaken: return "NotTaken";
    case P::Failed: return "Failed";
  }
  return "?";
}

const char* RoundJoin::toString(Event event) {
  switch (event) {
    case Event::LastCallArmed: return "last call armed";
    case Event::LastCallDisarmed: return "last call disarmed";
    case Event::ShortOfMin: return "short of MIN";
    case Event::Closed: return "closed";
    case Event::ClosedWithoutMe: return "closed without this node";
    case Event::VacancyTaken: return "a lost member's place taken";
    case Event::Error: return "error";
  }
  return "?";
}

// The machine, whole: (phase, event) -> next phase. An event with no rule is logged and ignored.
const RoundJoin::Rule RoundJoin::kRules[] = {
    {P::Joining, Event::LastCallArmed, P::LastCall},
    {P::LastCall, Event::LastCallDisarmed, P::Joining},
    {P::Joining, Event::ShortOfMin, P::Replacing},
    {P::Joining, Event::Closed, P::Decided},
    {P::LastCall, Event::Closed, P::Decided},
    {P::Replacing, Event::Closed, P::Decided},
    {P::Joining, Event::ClosedWithoutMe, P::NotTaken},
    {P::LastCall, Event::ClosedWithoutMe, P::NotTaken},
    {P::Replacing, Event::ClosedWithoutMe, P::NotTaken},
    {P::Joining, Event::VacancyTaken, P::Decided},
    {P::Replacing, Event::VacancyTaken, P::Decided},
    {P::Joining, Event::Error, P::Failed},
    {P::LastCall, Event::Error, P::Failed},
    {P::Replacing, Event::Error, P::Failed},
};

void RoundJoin::on(Event event, const std::string& reason) {
  for (const Rule& rule : kRules) {
    if (rule.from != phase_ || rule.event != event) continue;
    const auto now = Clock::now();
    spdlog::debug("rendezvous '{}' round {}: {} -> {} ({}{}) after {} in {}", node_.runId(), round_,
                  rdzv::toString(phase_), rdzv::toString(rule.to), toString(event),
                  reason.empty() ? "" : ": " + reason,
                  ms(std::chrono::duration_cast<milliseconds>(now - phaseSince_)),
                  rdzv::toString(phase_));
    phase_ = rule.to;
    phaseSince_ = now;
    return;
  }
  spdlog::debug("rendezvous '{}' round {}: {} ignored in {}", node_.runId(), round_, toString(event),
                rdzv::toString(phase_));
}

RoundJoin::RoundJoin(LivenessStore& store, const C10dNode& node, ExitBarrier& barrier, uint64_t round,
                     bool forRunningJob)
    : store_(store),
      node_(node),
      barrier_(barrier),
      closer_(store, node),
      round_(round),
      forRunningJob_(forRunningJob) {}

std::optional<Seat> RoundJoin::run(Deadline& deadline, const Announcement& announce) {
  const RendezvousOptions& o = node_.options;
  const std::string& id = node_.runId();
  const std::string statusKey = keys::status(id, round_);

  // A member re-forming is counted back (`rejoined`) only once it is in `joined`, so a closer
  // that sees it back also sees it joined. Its will counts it gone from the previous round too
  // (`left` of round-1): dying before it counted itself back, it is then no survivor to wait
  // for (the survivors waited for it until the join timeout). Dying after, it is counted back
  // and gone at once, which can only close the round one survivor early; that survivor then
  // joins the next round as a newcomer.
  // One batch (one round trip on a TcpStore), run in this order: the will, this node's count in
  // `present` at its first join (the will's -1 balances it: one batch reaches the store whole or
  // not at all, so neither is there without the other; ExitBarrier::countIn), the join, the
  // count. Told only once this node is in `joined`: the running nodes re-form when told, and a
  // round they closed before this node's descriptor was there would leave it out (it would then
  // wait in the next round as if the job were full).
  StoreBatch batch;
  const size_t will = batch.setWill(keys::joinWill(id, round_, node_.self.id,
                                                   node_.self.displayName(), node_.self.rejoining));
  const std::optional<size_t> present = barrier_.countIn(batch);
  batch.append(keys::joined(id, round_), node_.descriptorLine);
  const size_t count = batch.add(keys::count(id, round_), 1);
  if (node_.self.rejoining) batch.add(keys::rejoined(id, round_), 1);
  if (announce.round) {
    batch.add(keys::waiting(id, *announce.round), 1);
    signalChange(batch, id, *announce.round, announce.reason);
  }
  // Joining after a round closed: whether the job ended meanwhile, read after this node's count
  // in the same batch. A node that checked the outcome (enterJob) before the job ended, but whose
  // count landed after the last node out removed the job's keys (and with them this round's
  // `status`, which nothing bumps again), would otherwise wait here alone until the join timeout.
  const std::optional<size_t> ended =
      round_ > 0 ? std::optional<size_t>(batch.tryGet(keys::outcome(id))) : std::nullopt;
  try {
    store_.runBatch(batch);
  } catch (const NetworkError&) {
    throw;  // the connection closed: the will (if set) runs, the caller joins afresh
  } catch (const std::exception& e) {
    if (present) barrier_.entered(batch, *present);  // counted in: leave() counts it out
    // The batch goes on past a failed call: without its will, a node counted in would never be
    // seen gone. Give its place up as the will would, then fail as the call did.
    if (!batch.ok(will)) try {
        giveUpPlace("node " + node_.self.displayName() + " could not join round " +
                    std::to_string(round_) + " (its will was refused: " + e.what() + ")");
      } catch (const Error& also) {
        spdlog::debug("rendezvous '{}': giving up the place in round {}: {}", id, round_,
                      also.what());
      }
    throw;
  }
  if (present) barrier_.entered(batch, *present);
  if (ended && batch.value(*ended)) barrier_.throwIfJobEnded(store_);
  int64_t arrivals = batch.number(count);
  reform_ = closer_.readReform(round_);
  // A re-forming round closes when every survivor is back, so it has no last call; only a
  // first round (or one after a failed decision) waits for more nodes.
  const bool elastic = o.minNodes < o.maxNodes && !reform_.active;
  spdlog::debug("rendezvous '{}': joined round {} as arrival {} (need {}..{}{})", id, round_,
                arrivals, o.minNodes, o.maxNodes, reform_.active ? ", re-forming" : "");
  if (auto place = takePlace()) return place;
  if (!closeIfComplete(arrivals) && elastic && arrivals >= o.minNodes) startLastCall(armLastCall());

  std::optional<Bytes> known;  // status as last seen (nullopt: absent)
  bool event = false;          // `known` came from a watch that returned: something happened
  ProgressPacer progress(o.progressInterval);
  try {
    for (;;) {
      if (known)
        if (auto state = keys::parseState(*known)) return seat(*state);
      if (event) {
        event = false;
        // The decision can exist before status shows it (its closer died in between).
        if (auto decided = store_.tryGet(keys::state(id, round_)))
          if (auto state = keys::parseState(*decided)) return seat(*state);
        if (auto place = takePlace()) return place;
        // A newcomer in round 0 of a store the survivors refilled (it restarted): the job
        // re-forms in their round (store_refill.hpp).
        if (round_ == 0 && !node_.self.rejoining)
          if (auto refill = readRefill(store_, id); refill && refill->round > 0) {
            movedTo_ = refill->round;
            on(Event::ClosedWithoutMe, "the store was refilled: the job re-forms in round " +
                                           std::to_string(refill->round));
            return std::nullopt;
          }
        // Only a job that formed can have ended: before a round of it closed, an `outcome` is
        // stale or forged, and believing it would end this node "successfully" with no worker run.
        if (reform_.active) barrier_.throwIfJobEnded(store_);
        if (elastic) {
          auto armer = store_.tryGet(keys::lastCall(id, round_));
          if (!armer && lastCallAt_ != kNever) {
            lastCallAt_ = kNever;
            on(Event::LastCallDisarmed, "too few alive at the last call");
          } else if (armer && lastCallAt_ == kNever) {
            startLastCall(*armer == node_.self.id);
          }
        }
        arrivals = keys::parseCounter(store_.tryGet(keys::count(id, round_))).value_or(0);
        // A re-forming round is evaluated by every waiter (survivors that died change what
        // "complete" means; compare_set on `state` keeps one decision). Otherwise, with MAX
        // arrivals counted and still open, the closer may have died mid-close: one waiter,
        // elected per event, evaluates again.
        if (reform_.active)
          closeIfComplete(arrivals);
        else if (known && arrivals >= o.maxNodes &&
                 store_.compareSet(keys::reeval(id, round_, *known), "", node_.self.id) ==
                     node_.self.id)
          closer_.tryClose(round_, o.maxNodes, reform_);
      }
      if (Clock::now() >= lastCallAt_) {
        lastCallAt_ = kNever;
        if (!closer_.tryClose(round_, o.minNodes, reform_)) disarmLastCall();
      }
      if (Clock::now() >= replaceBy_) closeIfComplete(arrivals);
      if (deadline.expired()) {
        // A node waiting for the next round of a job that is still running (a spare, a late
        // node) waits as long as the job runs; only a round that cannot form times out. A member
        // re-forming the job is not waiting for it: the survivors it waits for are re-forming
        // too, and one that never comes back (its death hidden, a stuck agent) must not hold it
        // for ever. Survivors waiting for a replacement wait for replace_timeout instead.
        if (phase_ != P::Replacing && (node_.self.rejoining || !jobRunsWithout())) {
          // The job may have ended as the wait did (no run is left for this node to wait for):
          // that is its end, not a timeout (the enumeration of a cut during a node's own finish,
          // the others finishing just as its join timed out).
          if (round_ > 0) barrier_.throwIfJobEnded(store_);
          timedOut();
        }
        deadline = Deadline(o.joinTimeout);
      }
      milliseconds wait = deadline.remaining();
      if (o.say) {
        if (progress.due()) o.say(waitingText(arrivals, deadline));
        wait = std::min(wait, progress.untilDue());
      }
      for (Clock::time_point at : {lastCallAt_, replaceBy_})
        if (at != kNever) {
          auto until = std::chrono::duration_cast<milliseconds>(at - Clock::now());
          wait = std::min(wait, std::max(until + 1ms, 1ms));  // remaining() may be 0
        }
      // Returns at once when status differs from `known` (also after this node's own writes).
      try {
        known = store_.watch(statusKey, known, wait);
        event = true;
      } catch (const TimeoutError&) {
      }
    }
  } catch (const JobEnded&) {
    throw;  // not a failure of this round: the job is over
  } catch (const std::exception& e) {
    on(Event::Error, e.what());
    throw;
  }
}

// Closes the round when it is complete: MAX arrivals (a first round), or (re-forming) every
// survivor of the previous round is back and MIN are alive. Short of MIN after that, it waits up
// to replace_timeout for newcomers to take the lost nodes' places, then fails the round for
// every waiter, naming the lost nodes. Returns whether the round closed.
bool RoundJoin::closeIfComplete(int64_t arrivals) {
  const RendezvousOptions& o = node_.options;
  if (!reform_.active) return arrivals >= o.maxNodes && closer_.tryClose(round_, o.maxNodes, reform_);
  if (!closer_.everySurvivorBack(round_, reform_)) return false;
  // No survivor left to wait for can mean the job ended (its members finished and left while
  // this node joined): that is the job's end, not a round for the nodes still waiting.
  barrier_.throwIfJobEnded(store_);
  if (closer_.tryClose(round_, o.minNodes, reform_)) return true;
  const std::string shortage = "the job lost " + closer_.lostNodes(reform_) + "; " +
                               std::to_string(closer_.aliveJoiners()) +
                               " node(s) remain, fewer than the minimum of " +
                               std::to_string(o.minNodes) + " (--nnodes " +
                               std::to_string(o.minNodes) + ":" + std::to_string(o.maxNodes) + ")";
  if (phase_ != P::Replacing && replaceTimeout() > 0ms) {
    replaceBy_ = Clock::now() + replaceTimeout();
    shortage_ = shortage;
    on(Event::ShortOfMin, shortage);
    const std::string line = shortage + "; waiting up to " + humanDuration(replaceTimeout()) +
                             " for replacement node(s) (--rdzv-conf replace_timeout)";
    spdlog::info("rendezvous '{}': {}", node_.runId(), line);
    if (o.say) o.say(line);
    return false;
  }
  if (phase_ == P::Replacing && Clock::now() < replaceBy_) return false;
  closer_.failRound(round_, shortage + (replaceTimeout() > 0ms
                                            ? "; no replacement came within " +
                                                  humanDuration(replaceTimeout())
                                            : std::string()));
}

// The armer evaluates the last call at the last call timeout, the others a margin later (they
// take over only if the armer died).
void RoundJoin::startLastCall(bool armedByMe) {
  const milliseconds lastCall = node_.options.lastCallTimeout;
  lastCallAt_ = Clock::now() + lastCall + (armedByMe ? 0ms : backupMargin(lastCall));
  on(Event::LastCallArmed, armedByMe ? "armed by this node" : "armed by another node");
}

// Returns whether this node armed it (the others are backups).
bool RoundJoin::armLastCall() {
  return store_.compareSet(keys::lastCall(node_.runId(), round_), "", node_.self.id) == node_.self.id;
}

// Too few alive at the last call: start over, so the next arrival arms it afresh. Waiters are
// told (status+1) so that they drop their timers.
void RoundJoin::disarmLastCall() {
  store_.deleteKey(keys::lastCall(node_.runId(), round_));
  bumpStatus(store_, node_.runId(), round_);
  on(Event::LastCallDisarmed, "too few alive at the last call");
}

milliseconds RoundJoin::replaceTimeout() const {
  const RendezvousOptions& o = node_.options;
  return o.replaceTimeout < 0ms ? o.joinTimeout : o.replaceTimeout;
}

// The round is decided (`state` may be the header only): this node's seat, or nullopt when it is
// not in it.
std::optional<Seat> RoundJoin::seat(const keys::RoundState& state) {
  const std::string& id = node_.runId();
  const RendezvousOptions& o = node_.options;
  if (!state.ok)
    throw InvalidArgument("rendezvous '" + id + "' round " + std::to_string(round_) +
                          " failed: " + state.error);
  Seat seat;
  RoundResult& r = seat.result;
  r.round = round_;
  r.nodeCount = state.nodeCount;
  r.worldSize = state.worldSize;
  r.restartCount = state.restartCount;
  r.masterAddr = state.masterAddr;
  r.masterPort = state.masterPort;
  r.storePrefix = keys::round(id, round_);
  // One round trip: this node's assignment, the hosts list (up to kMaxHostsInResult nodes; the
  // closer wrote it before the decision) and whether the next round closed already. A node
  // that read this round's decision that late (its members re-formed without it) must not start
  // this round's workers: two rounds would run at once. It waits in the next one, as a node the
  // round closed without (the interleavings over etcd cover it: a slow reader's round).
  StoreBatch reads;
  const size_t assignRead = reads.tryGet(keys::assign(id, round_, node_.self.id));
  const size_t laterRead = reads.tryGet(keys::status(id, round_ + 1));
  // (SIZE_MAX: not read, past kMaxHostsInResult nodes.)
  const size_t hostsRead =
      r.nodeCount <= kMaxHostsInResult ? reads.tryGet(keys::hosts(id, round_)) : SIZE_MAX;
  store_.runBatch(reads);
  if (const auto& later = reads.value(laterRead); later && keys::parseState(*later)) {
    on(Event::ClosedWithoutMe, "round " + std::to_string(round_ + 1) + " closed before this node read it");
    return std::nullopt;
  }
  if (const auto& mine = reads.value(assignRead)) {
    const keys::Assignment a = keys::parseAssignment(*mine);
    r.nodeRank = a.nodeRank;
    r.rankOffset = a.rankOffset;
    if (hostsRead != SIZE_MAX) {
      std::optional<Bytes> hosts = reads.value(hostsRead);
      if (!hosts) hosts = store_.get(keys::hosts(id, round_), o.readTimeout);  // not there yet: wait
      r.hosts = keys::parseHostList(*hosts, static_cast<size_t>(r.nodeCount));
    }
  } else {
    // Not a member, or its closer died before publishing the assignments: the roster in
    // `state` decides (O(N) bytes, read on this rare path only).
    auto decided = keys::parseState(store_.get(keys::state(id, round_), o.readTimeout));
    if (!decided || decided->roster.empty())
      throw ProtocolError("rendezvous '" + id + "' round " + std::to_string(round_) +
                          ": the decision has no roster");
    bool member = false;
    int offset = 0;
    for (size_t rank = 0; rank < decided->roster.size(); ++rank) {
      const auto& entry = decided->roster[rank];
      if (entry.id == node_.self.id) {
        member = true;
        r.nodeRank = static_cast<int>(rank);
        r.rankOffset = offset;
      }
      offset += entry.localWorldSize;
      if (r.nodeCount <= kMaxHostsInResult) r.hosts.push_back(entry.name);
    }
    if (!member) {
      on(Event::ClosedWithoutMe, std::to_string(state.nodeCount) + " node(s) taken");
      return std::nullopt;
    }
  }
  const size_t hostsExpected = r.nodeCount <= kMaxHostsInResult ? size_t(r.nodeCount) : 0;
  if (r.hosts.size() != hostsExpected || r.nodeRank >= r.nodeCount ||
      int64_t{r.rankOffset} + o.localWorldSize > r.worldSize)
    throw ProtocolError("rendezvous '" + id + "' round " + std::to_string(round_) +
                        ": inconsistent decision in the store (node rank " +
                        std::to_string(r.nodeRank) + " of " + std::to_string(r.nodeCount) + ", " +
                        std::to_string(r.hosts.size()) + " hosts)");
  seat.changesAtClose = state.changesAtClose;
  seat.leftAtClose = state.leftAtClose;
  seat.rosterDigest = state.rosterDigest;
  on(Event::Closed, "node rank " + std::to_string(r.nodeRank) + " of " + std::to_string(r.nodeCount));
  return seat;
}

// A waiting node (not a member of the running round) takes a lost member's place there when one
// is offered (vacancy_board.hpp): under a new id, its registration in this round given up.
std::optional<Seat> RoundJoin::takePlace() {
  if (!forRunningJob_ || !reform_.active || node_.self.rejoining) return std::nullopt;
  auto taken = takeVacancy(store_, node_, reform_.previous.round, newNodeId());
  if (!taken) return std::nullopt;
  Seat seat;
  seat.result = std::move(taken->result);
  seat.changesAtClose = taken->changesAtTake;
  seat.leftAtClose = taken->leftAtClose;
  seat.lostSeen = taken->lostSeen;
  seat.memberId = taken->memberId;
  seat.decidedNodeCount = taken->decidedNodeCount;
  on(Event::VacancyTaken, "node rank " + std::to_string(seat.result.nodeRank) + " of round " +
                              std::to_string(seat.result.round) + ", generation " +
                              std::to_string(seat.result.generation));
  return seat;
}

// The join timeout passed: give up this node's place (as its will would) and say who came.
void RoundJoin::timedOut() {
  const std::string& id = node_.runId();
  const RendezvousOptions& o = node_.options;
  std::string who;
  size_t alive = 0;
  try {
    auto nodes = keys::parseJoined(store_.tryGet(keys::joined(id, round_)).value_or(""));
    std::erase_if(nodes, [&](const keys::NodeDescriptor& n) { return n.id == node_.self.id; });
    closer_.removeDead(round_, nodes);
    alive = nodes.size() + 1;
    who = node_.self.displayName() + " (this node)";
    for (size_t i = 0; i < nodes.size() && i + 1 < kMaxNamesInMessage; ++i)
      who += ", " + nodes[i].displayName();
    if (nodes.size() + 1 > kMaxNamesInMessage)
      who += ", and " + std::to_string(nodes.size() + 1 - kMaxNamesInMessage) + " more";
    giveUpPlace("node " + node_.self.displayName() + " gave up waiting in round " +
                std::to_string(round_));
    store_.setWill(barrier_.presenceWill());  // not twice in the round; once out of `present`
  } catch (const Error& e) {
    who = "unknown (" + std::string(e.what()) + ")";
  }
  const std::string need = o.minNodes == o.maxNodes
                               ? std::to_string(o.minNodes)
                               : "at least " + std::to_string(o.minNodes) + " (max " +
                                     std::to_string(o.maxNodes) + ")";
  throw TimeoutError("rendezvous '" + id + "' round " + std::to_string(round_) + " at " +
                     node_.endpoint + " timed out after " + ms(o.joinTimeout) + ": " +
                     std::to_string(alive) + " node(s) joined [" + who + "], need " + need);
}

// Does what the will would do (minus `left` and `present`: this node was never a member, and it
// leaves the job itself): the others count it gone.
void RoundJoin::giveUpPlace(const std::string& reason) {
  const std::string& id = node_.runId();
  store_.set(keys::dead(id, round_, node_.self.id), "1");
  signalChange(store_, id, round_, reason);
  bumpStatus(store_, id, round_);
}

// Whether the previous round closed and its job still runs (no outcome, a member left): then
// a node waiting in this round waits on.
bool RoundJoin::jobRunsWithout() {
  const Reform reform = closer_.readReform(round_);
  return reform.active && !store_.check({keys::outcome(node_.runId())}) &&
         survivorsOf(store_, reform.previous) > 0;
}

// How a long join wait goes, for the progress line (no store calls: it says what is known).
std::string RoundJoin::waitingText(int64_t arrivals, const Deadline& deadline) const {
  const RendezvousOptions& o = node_.options;
  const std::string at = " at " + node_.endpoint;
  if (phase_ == P::Replacing) {
    auto left = std::chrono::duration_cast<milliseconds>(replaceBy_ - Clock::now());
    return "waiting for replacement node(s): " + shortage_ + at + "; " + humanDuration(left) +
           " left";
  }
  if (forRunningJob_)
    return "waiting to join the running job (round " + std::to_string(round_) + ")" + at;
  if (phase_ == P::LastCall) {
    auto left = std::chrono::duration_cast<milliseconds>(lastCallAt_ - Clock::now());
    return std::to_string(arrivals) + " of at most " + std::to_string(o.maxNodes) +
           " node(s) joined" + at + "; last call for more, closing in " + humanDuration(left);
  }
  const int64_t missing = std::max<int64_t>(1, o.minNodes - arrivals);
  return "waiting for " + std::to_string(missing) + " more node(s) (" + std::to_string(arrivals) +
         "/" + std::to_string(o.minNodes) + " joined" + at + "), " +
         humanDuration(deadline.remaining()) + " left";
}

}  // namespace drun::rdzv

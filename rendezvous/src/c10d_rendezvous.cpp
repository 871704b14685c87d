// The c10d-style rendezvous over a Store: the join/close algorithm and the job's state. Design
// and key scheme: keys.hpp, rendezvous/README.md. Pure planning: round_planner.cpp; events of a
// running round: membership_watcher.cpp; the embed-the-server policy: c10d_factory.cpp.
//
// One round, seen from one joiner (7 store calls; the closer adds 4 whose size is O(N)):
//   setWill(dead flag, last_change, changes+1, status+1, left+1, next round's status+1)
//   append(joined, my descriptor line); n = add(count, 1); a member of the previous round also
//   adds 1 to `rejoined`
//   n >= MAX: try to close;  re-forming and every survivor of the previous round is back: close
//   now;  MIN <= n < MAX: arm the last call (compare_set lastcall "" -> me)
//   watch(status): returns the decision's header once the round closed, or an event (a will
//   fired, last call disarmed) after which the joiner looks again; a local timer runs the last
//   call. Then get(assign/<me>) and get(hosts) (a compact host list: runs like node[0-4095]).
// Closing: read changes (c0), joined, (only when c0 > 0) the dead flags; take the alive joiners,
// members of the previous round first, at most MAX; plan ranks; compare_set(state, "" ->
// decision with roster) decides among concurrent closers; the winner multi_sets every
// assignment, hosts, round = r + 1 and status = header.
#include "drun/rendezvous/c10d_rendezvous.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <random>

#include <spdlog/spdlog.h>

#include "drun/common/deadline.hpp"
#include "drun/common/error.hpp"
#include "drun/rendezvous/port_reservation.hpp"
#include "drun/rendezvous/store_server.hpp"
#include "job_ledger.hpp"
#include "membership_watcher.hpp"

namespace drun::rdzv {
namespace {

using keys::NodeDescriptor;
using keys::RoundState;

// How many joined nodes a timeout message names.
constexpr size_t kMaxNamesInMessage = 32;

std::string newNodeId() {
  std::random_device rd;
  std::mt19937_64 gen((uint64_t(rd()) << 32) ^ rd() ^
                      uint64_t(Clock::now().time_since_epoch().count()));
  char buf[48];
  std::snprintf(buf, sizeof buf, "%x-%016llx", unsigned(::getpid()),
                static_cast<unsigned long long>(gen()));
  return buf;
}

std::string ms(milliseconds d) { return std::to_string(d.count()) + "ms"; }

// The delay of a backup closer (a joiner that did not arm the last call) behind the armer, so
// that normally exactly one node evaluates the close.
milliseconds backupMargin(milliseconds lastCall) {
  return std::max<milliseconds>(100ms, lastCall / 10);
}

// The longest single watch of the membership watcher: a lost link shows as a watch with no reply
// after slice + the client's grace (at least 500 ms), which stays within heartbeatTimeout.
milliseconds watchSlice(milliseconds heartbeatTimeout) {
  return std::max<milliseconds>(200ms, heartbeatTimeout - 600ms);
}

// The previous round as a re-forming round sees it: who of its members can still come back.
struct Reform {
  bool active = false;   // the previous round closed: its members re-join
  RoundBaseline previous;
};

constexpr auto kNever = Clock::time_point::max();

// How often a closer re-reads its snapshot when wills keep running under it.
constexpr int kMaxCloseLooks = 3;

// The timers of one join: the last call, and the wait for replacement nodes after a loss.
struct CloseClock {
  Clock::time_point lastCallAt = kNever;
  Clock::time_point replaceBy = kNever;
  std::string shortage;  // who was lost, for the progress line
};

class C10dRendezvous final : public Rendezvous {
 public:
  C10dRendezvous(const RendezvousOptions& options, C10dStoreAccess access)
      : options_(options),
        store_(std::move(access.store)),
        connect_(std::move(access.connectWatcher)),
        endpoint_(access.endpoint.empty() ? "the store" : access.endpoint),
        server_(std::move(access.server)),
        slot_(std::make_shared<EventSlot>()) {
    keys::validateRunId(options_.runId);
    if (!store_) throw InvalidArgument("c10d rendezvous: no store");
    if (options_.minNodes < 1 || options_.maxNodes < options_.minNodes)
      throw InvalidArgument("invalid --nnodes " + std::to_string(options_.minNodes) + ":" +
                            std::to_string(options_.maxNodes));
    self_.id = newNodeId();
    self_.host = options_.localAddr.empty() ? hostName() : options_.localAddr;
    self_.addr = !options_.localAddr.empty()    ? options_.localAddr
                 : !access.selfAddress.empty() ? access.selfAddress
                                               : "127.0.0.1";
    self_.localWorldSize = options_.localWorldSize;
    self_.requestedRank = options_.nodeRank;
    keys::encodeDescriptor(self_);  // validates the fields before anything touches the store
  }

  ~C10dRendezvous() override {
    stopWatcher();
    // Closing the connection without leave() runs the will: the others see this node die.
    store_.reset();
    if (server_) server_->stop();
  }

  RoundResult next() override {
    if (left_) throw InvalidArgument("rendezvous '" + options_.runId + "': next() after leave()");
    stopWatcher();
    Deadline deadline(options_.joinTimeout);
    const auto started = Clock::now();
    spare_ = false;
    joiningRunningJob_ = false;
    // A fresh MASTER_PORT every round: ranks of an old round, fenced off or not yet stopped, can
    // never reach the new round's store. Held while the round forms, released once it has.
    reservation_ = PortReservation::reserveOtherThan(self_.addr, self_.masterPort);
    self_.masterPort = reservation_.port();
    self_.rejoining = lastRound_.has_value();
    self_.previousRank = lastRound_ ? std::optional<int>(lastNodeRank_) : std::nullopt;
    descriptorLine_ = keys::encodeDescriptor(self_);

    for (int attempt = 0;; ++attempt) {
      if (storeLost_) reconnect(deadline);  // throws when the store is gone for good
      try {
        if (!present_) enterJob(deadline);
        if (!configChecked_) checkJobConfig();
        RoundResult result = joinFrom(startRound(), deadline, started);
        // Any program must be able to bind MASTER_PORT, with SO_REUSEADDR or without.
        reservation_.release();
        return result;
      } catch (const NetworkError& e) {
        // The connection broke mid-join (the watcher may not have noticed yet): connect again
        // and join afresh, within the same deadline.
        if (!connect_ || server_ || attempt >= 3) throw;
        spdlog::info("rendezvous '{}': {}; reconnecting", id(), e.what());
        storeLost_ = true;
      }
    }
  }

  FailureRecord reportFailure(const FailureRecord& failure, int maxRestarts) override {
    if (!lastRound_) throw InvalidArgument("reportFailure() before a round formed");
    const uint64_t r = *lastRound_;
    FailureRecord mine = failure;
    mine.node = self_.displayName();  // how the other nodes know this one
    mine.final = restartCount_ >= maxRestarts;
    Store& s = *store_;
    const Bytes stored = s.compareSet(keys::failure(id(), r), "", keys::encodeFailure(mine));
    FailureRecord cause = mine;
    try {
      cause = keys::parseFailure(stored);
    } catch (const ProtocolError& e) {
      spdlog::warn("rendezvous '{}': {}; reporting this node's failure instead", id(), e.what());
    }
    wakeWatchers(r);  // they read the record itself
    if (cause.final) publishOutcome(r, cause);
    return cause;
  }

  void finish() override {
    if (!lastRound_) throw InvalidArgument("finish() before a round formed");
    const uint64_t r = *lastRound_;
    const int64_t done = store_->add(keys::finished(id(), r), 1);
    wakeWatchers(r);  // they read the counter itself
    if (done >= lastNodeCount_) publishOutcome(r, std::nullopt);
  }

  void leave() override {
    if (left_) return;
    left_ = true;
    stopWatcher();
    try {
      if (storeLost_) throw NetworkError("the store connection was lost");
      // A clean leave is not a death: drop the will first, so nobody is told to restart.
      store_->setWill({});
      if (lastRound_) {
        const uint64_t round = *lastRound_;
        store_->add(keys::left(id(), round), 1);
        wakeWatchers(round);  // the others look again (a job that ended: they end too)
      }
      if (present_) {
        present_ = false;
        // The last known node of the job to go (members, spares, late joiners alike) removes
        // its keys: a new start with the same id finds nothing to trip on.
        if (store_->add(keys::present(id()), -1) <= 0)
          removeJobKeys();
        else if (server_)
          waitForOthersToLeave();
      }
    } catch (const std::exception& e) {
      spdlog::debug("rendezvous '{}': leave: {}", options_.runId, e.what());
    } catch (...) {
      spdlog::debug("rendezvous '{}': leave: unknown error", options_.runId);
    }
    reservation_.release();
    store_.reset();
    if (server_) server_->stop();
  }

  void abandon() override {
    if (left_) return;
    left_ = true;
    stopWatcher();
    reservation_.release();
    store_.reset();  // the will runs: the others see this node lost and re-form without it
    if (server_) server_->stop();
  }

  void onJobEvent(std::function<void(const JobEvent&)> callback) override {
    std::lock_guard lock(slot_->mutex);
    slot_->callback = [this, callback = std::move(callback)](const JobEvent& event) {
      if (event.kind == JobEvent::Kind::StoreLost) storeLost_ = true;
      if (callback) callback(event);
    };
  }

 private:
  const std::string& id() const { return options_.runId; }

  struct Announcement {
    std::optional<uint64_t> round;  // the running round to tell that this node waits
    std::string reason;
  };

  // Every node of a job must be started with the same --nnodes: the first one to arrive records
  // its values; a node started with others fails at once, naming both, instead of waiting out the
  // join timeout. A job that has not formed yet fails for every waiting node with the same message
  // (its open round is decided as an error); a running job goes on without the odd node.
  void checkJobConfig() {
    const keys::JobConfig mine{options_.minNodes, options_.maxNodes, self_.displayName()};
    const std::string encoded = keys::encodeJobConfig(mine);
    const keys::JobConfig job =
        keys::parseJobConfig(store_->compareSet(keys::config(id()), "", encoded));
    if (job.sameShape(mine)) {
      configChecked_ = true;
      return;
    }
    auto shape = [](const keys::JobConfig& c) {
      return c.minNodes == c.maxNodes ? std::to_string(c.minNodes)
                                      : std::to_string(c.minNodes) + ":" + std::to_string(c.maxNodes);
    };
    const std::string message = "nodes disagree on --nnodes: " + self_.displayName() + " has --nnodes " +
                                shape(mine) + ", the job (first started on " + job.setBy +
                                ") has --nnodes " + shape(job) + "; start every node with the same value";
    const uint64_t current = keys::parseCounter(store_->tryGet(keys::currentRound(id()))).value_or(0);
    if (current == 0) {
      keys::RoundState failed;
      failed.ok = false;
      failed.error = message;
      const std::string decision = keys::encodeState(failed);
      if (store_->compareSet(keys::state(id(), 0), "", decision) == decision)
        store_->set(keys::status(id(), 0), decision);  // wakes every joiner of round 0
    }
    throw InvalidArgument("rendezvous '" + id() + "': " + message);
  }

  // Counts this node among the job's known nodes (`present`), once it is sure that the job it
  // joins has not already ended. An outcome with nobody present is what an ended job left
  // behind (its last node died before removing the keys, or this start came right after it): a
  // new start with the same id removes it (one resetter, elected by compare_set on `outcome`)
  // instead of tripping on its rounds. An outcome while nodes are present: they are leaving
  // (the store's host serves until they have); waited for at most close_timeout. An outcome
  // before any round of the job closed is stale or forged (no job ended that never formed): it
  // is removed and not believed.
  void enterJob(const Deadline& deadline) {
    Store& s = *store_;
    const std::string outcomeKey = keys::outcome(id());
    const std::string presentKey = keys::present(id());
    std::optional<Deadline> leaving;
    for (;;) {
      auto outcome = s.tryGet(outcomeKey);
      if (!outcome) break;
      if (keys::parseCounter(s.tryGet(keys::currentRound(id()))).value_or(0) == 0) {
        spdlog::warn("rendezvous '{}': ignoring a job outcome written before any round closed",
                     id());
        s.deleteKey(outcomeKey);
        break;
      }
      if (deadline.expired())
        throw TimeoutError("rendezvous '" + id() + "': an earlier run with this id ended and " +
                           "was not cleared within " + ms(options_.joinTimeout));
      const milliseconds slice = std::min(deadline.remaining(), options_.readTimeout);
      if (keys::isOutcomeReset(*outcome)) {
        watchQuietly(outcomeKey, outcome, slice);
        continue;
      }
      auto present = s.tryGet(presentKey);
      const int64_t stillHere = keys::parseCounter(present).value_or(0);
      if (stillHere > 0) {
        if (!leaving) {
          leaving.emplace(options_.closeTimeout);
          spdlog::info("rendezvous '{}': an earlier run with this id ended; waiting for its {} "
                       "node(s) to leave", id(), stillHere);
        }
        if (leaving->expired())
          throw Error("rendezvous '" + id() + "': an earlier run with this id ended, and " +
                      std::to_string(stillHere) + " of its node(s) are still attached after " +
                      ms(options_.closeTimeout) + "; wait for them to exit, or use another --rdzv-id");
        watchQuietly(presentKey, present, std::min(slice, leaving->remaining()));
        continue;
      }
      const std::string claim = keys::encodeOutcomeReset(self_.id);
      if (s.compareSet(outcomeKey, *outcome, claim) == claim) {
        removeJobKeys();
        spdlog::info("rendezvous '{}': an earlier run with this id ended; starting afresh", id());
        break;
      }
    }
    s.add(presentKey, 1);
    present_ = true;
  }

  void watchQuietly(const std::string& key, const std::optional<Bytes>& known, milliseconds slice) {
    try {
      store_->watch(key, known, slice);
    } catch (const TimeoutError&) {
    }
  }

  // Which round to join, and whom to tell.
  struct Start {
    uint64_t round = 0;
    Announcement announce;
  };

  Start startRound() {
    Start start;
    start.round =
        keys::parseCounter(store_->tryGet(keys::currentRound(id()))).value_or(0);
    if (lastRound_) {
      // A member re-forming: the others learned why from the store (a failure record, a will,
      // a waiting node); nobody needs telling.
      start.round = std::max(start.round, *lastRound_ + 1);
      return start;
    }
    if (start.round > 0) start.announce = announcementFor(start.round - 1);
    return start;
  }

  // A newcomer arriving while round `running` runs: it waits for the next round. With fewer
  // than MAX nodes the running nodes are told (they take it in after the last call); with MAX,
  // it is a spare: it tells nobody and replaces the next member lost.
  Announcement announcementFor(uint64_t running) {
    auto state = closedRound(running);
    if (state) throwIfJobEnded();  // (only a job that formed can have ended: see joinRound)
    if (state && state->nodeCount >= options_.maxNodes) {
      spare_ = true;
      spdlog::warn("rendezvous '{}': the job runs with {} node(s), the most it takes; {} waits as "
                   "a spare to replace a lost node",
                   id(), state->nodeCount, self_.displayName());
      return {};
    }
    return {running, "node " + self_.displayName() + " is waiting to join (round " +
                         std::to_string(running + 1) + ")"};
  }

  RoundResult joinFrom(Start start, Deadline& deadline, Clock::time_point started) {
    uint64_t round = start.round;
    Announcement announce = std::move(start.announce);
    joiningRunningJob_ = announce.round.has_value();
    for (;;) {
      if (auto result = joinRound(round, deadline, announce)) {
        lastRound_ = round;
        restartCount_ = result->restartCount;
        spdlog::debug("rendezvous '{}': round {} formed in {}: node rank {} of {}, world size {}, "
                      "restart {}",
                      id(), round,
                      ms(std::chrono::duration_cast<milliseconds>(Clock::now() - started)),
                      result->nodeRank, result->nodeCount, result->worldSize,
                      result->restartCount);
        startWatcher(round);
        return *result;
      }
      // The round closed without this node: wait in the next one, and tell the running nodes
      // (unless the job is full: then this node is a spare).
      spdlog::debug("rendezvous '{}': round {} closed without this node; waiting for round {}",
                    id(), round, round + 1);
      announce = announcementFor(round);
      joiningRunningJob_ = true;
      ++round;
    }
  }

  // Joins round `round`; returns the result, or nullopt when the round closed without this node.
  std::optional<RoundResult> joinRound(uint64_t round, Deadline& deadline,
                                       const Announcement& announce) {
    Store& s = *store_;
    const std::string statusKey = keys::status(id(), round);

    s.setWill(keys::joinWill(id(), round, self_.id, self_.displayName()));
    if (announce.round) announceWaiting(*announce.round, announce.reason);
    s.append(keys::joined(id(), round), descriptorLine_);
    int64_t arrivals = s.add(keys::count(id(), round), 1);
    if (self_.rejoining) s.add(keys::rejoined(id(), round), 1);
    const Reform reform = readReform(round);
    // A re-forming round closes when every survivor of the previous round is back (never
    // earlier: newcomers alone would form a second job beside the running one), so it has no
    // last call; only a first round (or one after a failed decision) waits for more nodes.
    const bool elastic = options_.minNodes < options_.maxNodes && !reform.active;
    spdlog::debug("rendezvous '{}': joined round {} as arrival {} (need {}..{}{})", id(), round,
                  arrivals, options_.minNodes, options_.maxNodes,
                  reform.active ? ", re-forming" : "");
    CloseClock clock;
    // When this node evaluates the last call: the armer at the last call timeout, the others a
    // margin later (they take over only if the armer died).
    auto startLastCall = [&](bool armedByMe) {
      clock.lastCallAt = Clock::now() + options_.lastCallTimeout +
                         (armedByMe ? 0ms : backupMargin(options_.lastCallTimeout));
    };
    if (!closeIfComplete(round, arrivals, reform, clock) && elastic &&
        arrivals >= options_.minNodes)
      startLastCall(armLastCall(round));

    std::optional<Bytes> known;  // status as last seen (nullopt: absent)
    bool event = false;          // `known` came from a watch that returned: something happened
    ProgressPacer progress(options_.progressInterval);
    for (;;) {
      if (known)
        if (auto state = keys::parseState(*known)) return finish(round, *state);
      if (event) {
        event = false;
        // The decision can exist before status shows it (its closer died in between).
        if (auto decided = s.tryGet(keys::state(id(), round)))
          if (auto state = keys::parseState(*decided)) return finish(round, *state);
        // Only a job that formed can have ended: before a round of it closed, an `outcome` is
        // stale or forged, and believing it would end this node "successfully" with no worker run.
        if (reform.active) throwIfJobEnded();
        if (elastic) {
          auto armer = s.tryGet(keys::lastCall(id(), round));
          if (!armer)
            clock.lastCallAt = kNever;
          else if (clock.lastCallAt == kNever)
            startLastCall(*armer == self_.id);
        }
        arrivals = keys::parseCounter(s.tryGet(keys::count(id(), round))).value_or(0);
        // A re-forming round is evaluated by every waiter (survivors that died change what
        // "complete" means; compare_set on `state` keeps one decision). Otherwise, with MAX
        // arrivals counted and still open, the closer may have died mid-close: one waiter,
        // elected per event, evaluates again.
        if (reform.active)
          closeIfComplete(round, arrivals, reform, clock);
        else if (known && arrivals >= options_.maxNodes &&
                 s.compareSet(keys::reeval(id(), round, *known), "", self_.id) == self_.id)
          tryClose(round, options_.maxNodes, reform);
      }
      if (Clock::now() >= clock.lastCallAt) {
        if (!tryClose(round, options_.minNodes, reform)) disarmLastCall(round);
        clock.lastCallAt = kNever;
      }
      if (Clock::now() >= clock.replaceBy) closeIfComplete(round, arrivals, reform, clock);
      if (deadline.expired()) {
        // A node waiting for the next round of a job that is still running (a spare, a late
        // node) waits as long as the job runs; only a round that cannot form times out. A member
        // re-forming the job is not waiting for it: the survivors it waits for are re-forming
        // too, and one that never comes back (its death hidden, a stuck agent) must not hold it
        // for ever. Survivors waiting for a replacement wait for replace_timeout instead.
        if (clock.replaceBy == kNever && (self_.rejoining || !jobRunsWithout(round)))
          timedOut(round);
        deadline = Deadline(options_.joinTimeout);
      }
      milliseconds wait = deadline.remaining();
      if (options_.say) {
        if (progress.due()) options_.say(waitingText(round, arrivals, clock, deadline));
        wait = std::min(wait, progress.untilDue());
      }
      for (Clock::time_point at : {clock.lastCallAt, clock.replaceBy})
        if (at != kNever) {
          auto until = std::chrono::duration_cast<milliseconds>(at - Clock::now());
          wait = std::min(wait, std::max(until + 1ms, 1ms));  // remaining() may be 0
        }
      // Returns at once when status differs from `known` (also after this node's own writes).
      try {
        known = s.watch(statusKey, known, wait);
        event = true;
      } catch (const TimeoutError&) {
      }
    }
  }

  // How a long join wait goes, for the progress line (no store calls: it says what is known).
  std::string waitingText(uint64_t round, int64_t arrivals, const CloseClock& clock,
                          const Deadline& deadline) const {
    const std::string at = " at " + endpoint_;
    if (clock.replaceBy != kNever) {
      auto left = std::chrono::duration_cast<milliseconds>(clock.replaceBy - Clock::now());
      return "waiting for replacement node(s): " + clock.shortage + at + "; " +
             humanDuration(left) + " left";
    }
    if (spare_ || joiningRunningJob_)
      return "waiting to join the running job (round " + std::to_string(round) + ")" + at;
    if (clock.lastCallAt != kNever) {
      auto left = std::chrono::duration_cast<milliseconds>(clock.lastCallAt - Clock::now());
      return std::to_string(arrivals) + " of at most " + std::to_string(options_.maxNodes) +
             " node(s) joined" + at + "; last call for more, closing in " + humanDuration(left);
    }
    const int64_t missing = std::max<int64_t>(1, options_.minNodes - arrivals);
    return "waiting for " + std::to_string(missing) + " more node(s) (" + std::to_string(arrivals) +
           "/" + std::to_string(options_.minNodes) + " joined" + at + "), " +
           humanDuration(deadline.remaining()) + " left";
  }

  // The decision header of `round` when it closed successfully (its `status`), else nullopt.
  std::optional<RoundState> closedRound(uint64_t round) {
    auto header = store_->tryGet(keys::status(id(), round));
    auto state = header ? keys::parseState(*header) : std::nullopt;
    if (!state || !state->ok) return std::nullopt;
    return state;
  }

  // The previous round, when this round re-forms a closed one.
  Reform readReform(uint64_t round) {
    Reform reform;
    if (round == 0) return reform;
    auto state = closedRound(round - 1);
    if (!state) return reform;
    reform.active = true;
    reform.previous = {id(), round - 1, state->nodeCount, state->leftAtClose};
    return reform;
  }

  // Whether every member of the previous round that can come back is back in `round`. Until
  // then a re-forming round never closes: its survivors are still stopping their workers, and
  // a round formed without them would be a second job beside theirs.
  bool everySurvivorBack(uint64_t round, const Reform& reform) {
    const int64_t back =
        keys::parseCounter(store_->tryGet(keys::rejoined(id(), round))).value_or(0);
    return back >= survivorsOf(*store_, reform.previous);
  }

  milliseconds replaceTimeout() const {
    return options_.replaceTimeout < 0ms ? options_.joinTimeout : options_.replaceTimeout;
  }

  // Closes the round when it is complete: MAX arrivals (a first round), or (re-forming) every
  // survivor of the previous round is back and MIN are alive. A re-forming round short of MIN
  // waits up to replace_timeout for newcomers to take the lost nodes' places, then fails for
  // every waiter with the names of the lost nodes. Returns whether the round closed.
  bool closeIfComplete(uint64_t round, int64_t arrivals, const Reform& reform, CloseClock& clock) {
    if (!reform.active) return arrivals >= options_.maxNodes && tryClose(round, options_.maxNodes, reform);
    if (!everySurvivorBack(round, reform)) return false;
    if (tryClose(round, options_.minNodes, reform)) return true;
    const std::string shortage = "the job lost " + lostNodes(reform) + "; " +
                                 std::to_string(arrivals) +
                                 " node(s) remain, fewer than the minimum of " +
                                 std::to_string(options_.minNodes) + " (--nnodes " +
                                 std::to_string(options_.minNodes) + ":" +
                                 std::to_string(options_.maxNodes) + ")";
    if (clock.replaceBy == kNever && replaceTimeout() > 0ms) {
      clock.replaceBy = Clock::now() + replaceTimeout();
      clock.shortage = shortage;
      const std::string line = shortage + "; waiting up to " + humanDuration(replaceTimeout()) +
                               " for replacement node(s) (--rdzv-conf replace_timeout)";
      spdlog::info("rendezvous '{}': {}", id(), line);
      if (options_.say) options_.say(line);
      return false;
    }
    if (clock.replaceBy != kNever && Clock::now() < clock.replaceBy) return false;
    failRound(round, shortage + (replaceTimeout() > 0ms ? "; no replacement came within " +
                                                              humanDuration(replaceTimeout())
                                                        : std::string()));
  }

  // Decides the round as failed, so that every node waiting in it gets the same error.
  [[noreturn]] void failRound(uint64_t round, const std::string& message) {
    keys::RoundState failed;
    failed.ok = false;
    failed.error = message;
    const std::string decision = keys::encodeState(failed);
    const Bytes stored = store_->compareSet(keys::state(id(), round), "", decision);
    if (stored == decision) store_->set(keys::status(id(), round), decision);
    auto state = keys::parseState(stored);
    throw Error("rendezvous '" + id() + "': " +
                (state && !state->ok ? state->error : message));
  }

  // The members of the previous round whose dead flag is set (error path only: O(N) reads).
  std::string lostNodes(const Reform& reform) {
    std::string names;
    size_t count = 0;
    const uint64_t previous = reform.previous.round;
    try {
      auto state = keys::parseState(store_->get(keys::state(id(), previous),
                                                options_.readTimeout));
      for (const auto& member : state ? state->roster : std::vector<keys::RosterEntry>{}) {
        if (!store_->tryGet(keys::dead(id(), previous, member.id))) continue;
        if (count++ < kMaxNamesInMessage) names += (names.empty() ? "" : ", ") + member.name;
      }
    } catch (const Error& e) {
      return "node(s) (" + std::string(e.what()) + ")";
    }
    if (count > kMaxNamesInMessage)
      names += ", and " + std::to_string(count - kMaxNamesInMessage) + " more";
    return count == 0 ? std::string("node(s)") : "node(s) " + names;
  }

  // Whether round - 1 closed and its job still runs (no outcome, a member left): then a node
  // waiting in `round` waits on.
  bool jobRunsWithout(uint64_t round) {
    const Reform reform = readReform(round);
    return reform.active && !store_->check({keys::outcome(id())}) &&
           survivorsOf(*store_, reform.previous) > 0;
  }

  // Throws JobEnded when the job has an outcome (a node waiting to join learns it's over).
  void throwIfJobEnded() {
    auto outcome = store_->tryGet(keys::outcome(id()));
    if (!outcome || keys::isOutcomeReset(*outcome)) return;
    auto failure = keys::parseOutcome(*outcome);
    if (!failure)
      throw JobEnded("rendezvous '" + id() + "': the job finished (every worker succeeded) "
                     "while this node waited to join it", 0);
    throw JobEnded("rendezvous '" + id() + "': the job failed while this node waited to join " +
                       "it: rank " + std::to_string(failure->rank) + " on " + failure->node +
                       " ended with status " + std::to_string(failure->statusCode()),
                   failure->statusCode());
  }

  // Evaluates the round and closes it when at least `needed` alive nodes joined. Returns false
  // when too few are alive or (re-forming) a survivor is not back yet (nothing written).
  bool tryClose(uint64_t round, int needed, const Reform& reform) {
    Store& s = *store_;
    const auto t0 = Clock::now();
    if (reform.active && !everySurvivorBack(round, reform)) return false;
    // The snapshot of the alive joiners and `left` (the members' baseline) must agree: a joiner
    // whose will ran before `left` was read is out of the roster (its dead flag is read after),
    // and one whose will runs later is a member whose loss the watchers see. `left` is read
    // before and after; a will in between (they differ) makes the closer look again.
    std::vector<NodeDescriptor> nodes;
    int64_t changesAtRead = 0;
    int64_t leftAtRead = 0;
    for (int look = 0; look < kMaxCloseLooks; ++look) {
      leftAtRead = keys::parseCounter(s.tryGet(keys::left(id(), round))).value_or(0);
      changesAtRead = keys::parseCounter(s.tryGet(keys::changes(id(), round))).value_or(0);
      size_t skipped = 0;
      nodes = keys::parseJoined(s.tryGet(keys::joined(id(), round)).value_or(""), &skipped);
      if (skipped)
        spdlog::warn("rendezvous '{}': round {}: ignored {} malformed joiner record(s)", id(),
                     round, skipped);
      if (changesAtRead > 0 || leftAtRead > 0) removeDead(round, nodes);
      if (keys::parseCounter(s.tryGet(keys::left(id(), round))).value_or(0) == leftAtRead) break;
      // Out of looks: a loss in the window is then counted as a member's (a spurious re-form,
      // never a hidden death).
    }
    if (static_cast<int>(nodes.size()) < needed) {
      spdlog::debug("rendezvous '{}': round {}: {} alive joiner(s), need {}: not closing", id(),
                    round, nodes.size(), needed);
      return false;
    }
    nodes = pickMembers(std::move(nodes), options_.maxNodes);
    RoundDecision d = decideRound(id(), round, nodes,
                                  {changesAtRead, leftAtRead, restartCountFor(round)});
    if (s.compareSet(keys::state(id(), round), "", d.decision) == d.decision) {
      s.multiSet(d.keys, d.values);
      forgetRound(round);
      spdlog::debug("rendezvous '{}': closed round {} with {} node(s) in {}{}", id(), round,
                    nodes.size(),
                    ms(std::chrono::duration_cast<milliseconds>(Clock::now() - t0)),
                    d.state.ok ? "" : ": " + d.state.error);
    }
    return true;
  }

  // Once round r is decided nobody reads round r-2 any more (re-forming and the restart count
  // look one round back): its keys go, so that a job restarting for days keeps a few rounds in
  // the store, not all of them (the soak test's store memory stays flat).
  void forgetRound(uint64_t round) {
    if (round < 2) return;
    try {
      store_->deletePrefix(keys::round(id(), round - 2));
    } catch (const InvalidArgument& e) {
      spdlog::debug("rendezvous '{}': round {}'s keys stay: {}", id(), round - 2, e.what());
    }
  }

  // The job's restart count as of round `round`: the previous round's, plus one when it ended in
  // a failure. Advanced here, by the closer, once per restart.
  int restartCountFor(uint64_t round) {
    if (round == 0) return 0;
    auto state = closedRound(round - 1);
    if (!state) return 0;
    const bool failed = store_->check({keys::failure(id(), round - 1)});
    return state->restartCount + (failed ? 1 : 0);
  }

  void removeDead(uint64_t round, std::vector<NodeDescriptor>& nodes) {
    std::erase_if(nodes, [&](const NodeDescriptor& n) {
      return store_->tryGet(keys::dead(id(), round, n.id)).has_value();
    });
  }

  // Returns whether this node armed it (the others are backups).
  bool armLastCall(uint64_t round) {
    if (store_->compareSet(keys::lastCall(id(), round), "", self_.id) != self_.id) return false;
    spdlog::debug("rendezvous '{}': round {}: {} nodes reached, last call in {}", id(), round,
                  options_.minNodes, ms(options_.lastCallTimeout));
    return true;
  }

  // Too few alive at the last call: start over, so the next arrival arms it afresh. Waiters are
  // told (status+1) so that they drop their timers.
  void disarmLastCall(uint64_t round) {
    store_->deleteKey(keys::lastCall(id(), round));
    bumpStatus(round);
  }

  void bumpStatus(uint64_t round) {
    try {
      store_->add(keys::status(id(), round), 1);
    } catch (const InvalidArgument&) {
      // The round closed meanwhile: status holds the state now.
    }
  }

  // Wakes the round's membership watchers without a text: `last_change` keeps the text of the
  // latest loss or arrival, which is what the watchers quote.
  void wakeWatchers(uint64_t round) { store_->add(keys::changes(id(), round), 1); }

  void signalChange(uint64_t round, const std::string& reason) {
    store_->set(keys::lastChange(id(), round), reason);
    store_->add(keys::changes(id(), round), 1);
  }

  void announceWaiting(uint64_t round, const std::string& reason) {
    store_->add(keys::waiting(id(), round), 1);
    signalChange(round, reason);
  }

  // The job is over: record how, and wake the nodes waiting for the next round (spares) so that
  // they learn it.
  void publishOutcome(uint64_t round, const std::optional<FailureRecord>& failure) {
    store_->compareSet(keys::outcome(id()), "", keys::encodeOutcome(failure));
    bumpStatus(round + 1);
  }

  // The round is decided (`state` may be the header only). Returns nullopt when this node is not
  // in it.
  std::optional<RoundResult> finish(uint64_t round, const RoundState& state) {
    if (!state.ok)
      throw InvalidArgument("rendezvous '" + id() + "' round " + std::to_string(round) +
                            " failed: " + state.error);
    RoundResult r;
    r.round = round;
    r.nodeCount = state.nodeCount;
    r.worldSize = state.worldSize;
    r.restartCount = state.restartCount;
    r.masterAddr = state.masterAddr;
    r.masterPort = state.masterPort;
    r.storePrefix = keys::round(id(), round);
    if (auto mine = store_->tryGet(keys::assign(id(), round, self_.id))) {
      const keys::Assignment a = keys::parseAssignment(*mine);
      r.nodeRank = a.nodeRank;
      r.rankOffset = a.rankOffset;
      r.hosts = keys::parseHostList(store_->get(keys::hosts(id(), round), options_.readTimeout),
                                    static_cast<size_t>(r.nodeCount));
    } else {
      // Not a member, or its closer died before publishing the assignments: the roster in
      // `state` decides (O(N) bytes, read on this rare path only).
      auto decided = keys::parseState(store_->get(keys::state(id(), round), options_.readTimeout));
      if (!decided || decided->roster.empty())
        throw ProtocolError("rendezvous '" + id() + "' round " + std::to_string(round) +
                            ": the decision has no roster");
      bool member = false;
      int offset = 0;
      for (size_t rank = 0; rank < decided->roster.size(); ++rank) {
        const auto& entry = decided->roster[rank];
        if (entry.id == self_.id) {
          member = true;
          r.nodeRank = static_cast<int>(rank);
          r.rankOffset = offset;
        }
        offset += entry.localWorldSize;
        r.hosts.push_back(entry.name);
      }
      if (!member) return std::nullopt;
    }
    if (static_cast<int>(r.hosts.size()) != r.nodeCount || r.nodeRank >= r.nodeCount ||
        int64_t{r.rankOffset} + options_.localWorldSize > r.worldSize)
      throw ProtocolError("rendezvous '" + id() + "' round " + std::to_string(round) +
                          ": inconsistent decision in the store (node rank " +
                          std::to_string(r.nodeRank) + " of " + std::to_string(r.nodeCount) +
                          ", " + std::to_string(r.hosts.size()) + " hosts)");
    changesAtClose_ = state.changesAtClose;
    leftAtClose_ = state.leftAtClose;
    lastNodeCount_ = state.nodeCount;
    lastNodeRank_ = r.nodeRank;
    return r;
  }

  // The join timeout passed: give up this node's place (as its will would) and say who came.
  [[noreturn]] void timedOut(uint64_t round) {
    std::string who;
    size_t alive = 0;
    try {
      auto nodes = keys::parseJoined(store_->tryGet(keys::joined(id(), round)).value_or(""));
      std::erase_if(nodes, [&](const NodeDescriptor& n) { return n.id == self_.id; });
      removeDead(round, nodes);
      alive = nodes.size() + 1;
      who = self_.displayName() + " (this node)";
      for (size_t i = 0; i < nodes.size() && i + 1 < kMaxNamesInMessage; ++i)
        who += ", " + nodes[i].displayName();
      if (nodes.size() + 1 > kMaxNamesInMessage)
        who += ", and " + std::to_string(nodes.size() + 1 - kMaxNamesInMessage) + " more";
      // Do what the will would do (minus `left`: this node was never a member), then drop the
      // will so that this agent's exit does not count twice.
      store_->set(keys::dead(id(), round, self_.id), "1");
      signalChange(round, "node " + self_.displayName() + " gave up waiting in round " +
                              std::to_string(round));
      bumpStatus(round);
      store_->setWill({});
    } catch (const Error& e) {
      who = "unknown (" + std::string(e.what()) + ")";
    }
    std::string need = options_.minNodes == options_.maxNodes
                           ? std::to_string(options_.minNodes)
                           : "at least " + std::to_string(options_.minNodes) + " (max " +
                                 std::to_string(options_.maxNodes) + ")";
    throw TimeoutError("rendezvous '" + id() + "' round " + std::to_string(round) + " at " +
                       endpoint_ + " timed out after " + ms(options_.joinTimeout) + ": " +
                       std::to_string(alive) + " node(s) joined [" + who + "], need " + need);
  }

  // The store connection was lost (fencing stopped the workers already): connect again and join
  // as a new node would. A store that refuses connections is gone for good (its host died); one
  // that does not answer may come back (a cut link), so that is retried until the deadline.
  void reconnect(const Deadline& deadline) {
    if (!connect_ || server_)
      throw NetworkError("rendezvous '" + id() + "': lost the store at " + endpoint_);
    store_.reset();
    for (;;) {
      try {
        store_ = connect_();
        storeLost_ = false;
        lastRound_.reset();  // the old round counted this node gone: it comes back as a newcomer
        present_ = false;    // ... and its will counted it out of the job
        self_.rejoining = false;
        self_.previousRank.reset();
        descriptorLine_ = keys::encodeDescriptor(self_);
        spdlog::info("rendezvous '{}': connected to the store at {} again", id(), endpoint_);
        return;
      } catch (const TimeoutError& e) {
        if (deadline.expired())
          throw TimeoutError("rendezvous '" + id() + "': lost the store at " + endpoint_ +
                             " and could not reach it again within " + ms(options_.joinTimeout) +
                             ": " + e.what());
      } catch (const NetworkError& e) {
        throw NetworkError("rendezvous '" + id() + "': lost the store at " + endpoint_ +
                           ", and its host refuses connections (the store is gone): " + e.what());
      }
    }
  }

  void startWatcher(uint64_t round) {
    if (!connect_) return;
    WatchedRound w;
    w.runId = id();
    w.round = round;
    w.nodeCount = static_cast<int>(lastNodeCount_);
    w.changesAtClose = changesAtClose_;
    w.leftAtClose = leftAtClose_;
    w.endpoint = endpoint_;
    w.slice = watchSlice(options_.heartbeatTimeout);
    watcher_ = std::make_unique<MembershipWatcher>(connect_(), std::move(w), slot_);
  }

  void stopWatcher() { watcher_.reset(); }

  void removeJobKeys() {
    try {
      int64_t n = store_->deletePrefix(keys::job(id()));
      spdlog::debug("rendezvous '{}': last agent out, removed {} key(s)", id(), n);
    } catch (const InvalidArgument& e) {
      spdlog::debug("rendezvous '{}': keys left in the store: {}", id(), e.what());
    }
  }

  // The hosting agent keeps the store up until every other known node of the job (members,
  // spares, late joiners) left or was declared lost (its will ran), or closeTimeout passed.
  void waitForOthersToLeave() {
    const Deadline deadline(options_.closeTimeout);
    const std::string key = keys::present(id());
    for (;;) {
      auto value = store_->tryGet(key);
      const int64_t remaining = keys::parseCounter(value).value_or(0);
      if (!value || remaining <= 0) return;  // absent: the last one removed the job's keys
      if (deadline.expired()) {
        spdlog::info("rendezvous '{}': stopping the store with {} node(s) still attached after {}",
                     id(), remaining, ms(options_.closeTimeout));
        return;
      }
      watchQuietly(key, value, deadline.remaining());
    }
  }

  RendezvousOptions options_;
  std::unique_ptr<Store> store_;
  std::function<std::unique_ptr<Store>()> connect_;
  std::string endpoint_;
  std::unique_ptr<StoreServer> server_;
  std::shared_ptr<EventSlot> slot_;
  std::unique_ptr<MembershipWatcher> watcher_;
  NodeDescriptor self_;
  std::string descriptorLine_;
  PortReservation reservation_;
  std::optional<uint64_t> lastRound_;
  int restartCount_ = 0;
  int64_t changesAtClose_ = 0;
  int64_t leftAtClose_ = 0;
  int64_t lastNodeCount_ = 0;
  int lastNodeRank_ = 0;
  std::atomic<bool> storeLost_{false};
  bool left_ = false;
  bool present_ = false;      // counted in the job's `present` (by this connection)
  bool configChecked_ = false;
  bool spare_ = false;        // this join waits as a spare (the job runs with MAX nodes)
  bool joiningRunningJob_ = false;  // this join waits for a running job's next round
};

}  // namespace

std::unique_ptr<Rendezvous> makeC10dRendezvous(const RendezvousOptions& options,
                                               C10dStoreAccess access) {
  return std::make_unique<C10dRendezvous>(options, std::move(access));
}

}  // namespace drun::rdzv

// The c10d-style rendezvous over a Store: the facade that strings its units together. Design
// and key scheme: keys.hpp, rendezvous/README.md. Its units, one job each:
//   round_join.cpp          one node's join of one round (Joining -> LastCall -> Decided |
//                           NotTaken | Failed, Replacing after a loss below MIN): a table
//   round_closer.cpp        reading and deciding a round (re-forming, survivors back, the snapshot,
//                           the one decision)
//   job_ledger.cpp          the job's counters of a closed round: members gone, lost, survivors
//   exit_barrier.cpp        the node's presence in the job, the exit barrier, an ended job's reset
//   store_rejoin.cpp        after losing the store: connecting again, refilling a fresh one
//   membership_watcher.cpp  events of a running round;  round_planner.cpp  pure planning
//   c10d_factory.cpp        the embed-the-server policy
// next() = make sure the job has not ended (ExitBarrier::enter), check --nnodes against the job's
// and read the current round (one StoreBatch: enterJob), then join rounds (RoundJoin, whose first
// batch also counts this node in) from the current one until a round takes this node, then watch
// the round.
#include "drun/rendezvous/c10d_rendezvous.hpp"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <utility>

#include <spdlog/spdlog.h>

#include "c10d_node.hpp"
#include "drun/common/deadline.hpp"
#include "drun/common/error.hpp"
#include "drun/rendezvous/port_reservation.hpp"
#include "drun/store/store_batch.hpp"
#include "drun/store/store_server.hpp"
#include "exit_barrier.hpp"
#include "membership_watcher.hpp"
#include "round_closer.hpp"
#include "round_join.hpp"
#include "store_rejoin.hpp"
#include "vacancy_board.hpp"

namespace drun::rdzv {
namespace {

class C10dRendezvous final : public Rendezvous {
 public:
  C10dRendezvous(const RendezvousOptions& options, C10dStoreAccess access)
      : store_(std::move(access.store)),
        connect_(std::move(access.connectWatcher)),
        server_(std::move(access.server)),
        workerEndpoint_(std::move(access.workerEndpoint)),
        slot_(std::make_shared<EventSlot>()),
        barrier_(node_) {
    node_.options = options;
    node_.endpoint = access.endpoint.empty() ? "the store" : access.endpoint;
    keys::validateRunId(options.runId);
    if (!store_) throw InvalidArgument("c10d rendezvous: no store");
    if (options.minNodes < 1 || options.maxNodes < options.minNodes)
      throw InvalidArgument("invalid --nnodes " + std::to_string(options.minNodes) + ":" +
                            std::to_string(options.maxNodes));
    keys::NodeDescriptor& self = node_.self;
    self.id = newNodeId();
    self.host = options.localAddr.empty() ? hostName() : options.localAddr;
    self.addr = !options.localAddr.empty()    ? options.localAddr
                : !access.selfAddress.empty() ? access.selfAddress
                                              : "127.0.0.1";
    self.localWorldSize = options.localWorldSize;
    self.requestedRank = options.nodeRank;
    keys::encodeDescriptor(self);  // validates the fields before anything touches the store
  }

  ~C10dRendezvous() override {
    stopWatcher();
    // Closing the connection without leave() runs the will: the others see this node die.
    store_.reset();
    if (server_) server_->stop();
  }

  RoundResult next() override {
    if (left_) throw InvalidArgument("rendezvous '" + id() + "': next() after leave()");
    stopWatcher();
    Deadline deadline(options().joinTimeout);
    const auto started = Clock::now();
    keys::NodeDescriptor& self = node_.self;
    self.rejoining = lastRound_.has_value();
    self.previousRank = lastRound_ ? std::optional<int>(lastNodeRank_) : std::nullopt;

    for (int attempt = 0;; ++attempt) {
      if (rejoin_.lost() && !rejoin_.attempt(attempt, [this] { reconnectStore(); }, id())) continue;
      // A fresh MASTER_PORT every round: ranks of an old round, fenced off or not yet stopped, can
      // never reach the new round's store. Held while the round forms, released once it has.
      // Drawn again for every attempt: a join retried after a lost connection can land in the
      // round after one that closed with this node's last port (it never read that decision,
      // the others ran it).
      reservation_ = PortReservation::reserveOtherThan(self.addr, self.masterPort);
      self.masterPort = reservation_.port();
      node_.descriptorLine = keys::encodeDescriptor(self);
      try {
        RoundResult result = joinFrom(enterJob(deadline), deadline, started);
        // Any program must be able to bind MASTER_PORT, with SO_REUSEADDR or without.
        reservation_.release();
        return result;
      } catch (const NetworkError& e) {
        // The connection broke mid-join (the watcher may not have noticed yet): connect again
        // and join afresh, within the same deadline.
        if (!connect_ || server_ || attempt >= 3) throw;
        spdlog::info("rendezvous '{}': {}; reconnecting", id(), e.what());
        rejoin_.markLost();
      }
    }
  }

  FailureRecord reportFailure(const FailureRecord& failure) override {
    if (!lastRound_) throw InvalidArgument("reportFailure() before a round formed");
    const uint64_t r = *lastRound_;
    FailureRecord mine = failure;
    mine.node = node_.self.displayName();  // how the other nodes know this one
    // The budget every node agreed on (checkJobConfig), less the round's in-process recoveries.
    mine.final = failure.final || restartCount_ + recoveriesOf(r) >= options().maxRestarts;
    const Bytes stored = store_->compareSet(keys::failure(id(), r), "", keys::encodeFailure(mine));
    FailureRecord cause = mine;
    try {
      cause = keys::parseFailure(stored);
    } catch (const ProtocolError& e) {
      spdlog::warn("rendezvous '{}': {}; reporting this node's failure instead", id(), e.what());
    }
    rejoin_.noteFailed(r);
    wakeWatchers(*store_, id(), r);  // they read the record itself
    if (cause.final) barrier_.publishOutcome(*store_, r, cause);
    return cause;
  }

  bool finish() override {
    if (!lastRound_) throw InvalidArgument("finish() before a round formed");
    return barrier_.finish(*store_, *lastRound_, lastNodeCount_);
  }

  bool claimScaleUp() override {
    if (!lastRound_) throw InvalidArgument("claimScaleUp() before a round formed");
    return barrier_.claimScaleUp(*store_, *lastRound_);
  }

  void leave() override {
    if (left_) return;
    left_ = true;
    stopWatcher();
    bool left = false;
    try {
      if (rejoin_.lost()) throw NetworkError("the store connection was lost");
      barrier_.leave(*store_, lastRound_, lastNodeCount_, server_.get());
      left = true;
    } catch (const std::exception& e) {
      spdlog::debug("rendezvous '{}': leave: {}", id(), e.what());
    } catch (...) {
      spdlog::debug("rendezvous '{}': leave: unknown error", id());
    }
    reservation_.release();
    store_.reset();
    if (!left && server_) barrier_.serveAfterOwnLoss(connect_, *server_);
    if (server_) server_->stop();
  }

  bool reconnectAfterLoss(int knownRestarts) override {
    if (!rejoin_.lost()) return false;
    knownRestarts_ = knownRestarts;
    stopWatcher();
    for (int attempt = 0; !rejoin_.attempt(attempt, [this] { reconnectStore(); }, id()); ++attempt) {
    }
    return rejoin_.refilled();
  }

  void abandon() override {
    if (left_) return;
    left_ = true;
    stopWatcher();
    reservation_.release();
    store_.reset();  // the will runs: the others see this node lost and re-form without it
    if (server_) server_->stop();
  }

  std::string mergeShared(const std::string& name,
                          const std::function<std::string(const std::string&)>& merge) override {
    const std::string key = keys::sharedValue(id(), name);
    std::string current;  // "": stored only while the key is missing
    for (int attempt = 0; attempt < 16; ++attempt) {
      const std::string desired = merge(current);
      const Bytes stored = store_->compareSet(key, current, desired);
      if (stored == desired) return stored;
      current = stored;  // another node's value (or ours changed meanwhile): merge into it
    }
    throw Error("the shared value " + key + " kept changing (16 tries)");
  }

  std::optional<std::string> workerStoreEndpoint() const override {
    if (workerEndpoint_.empty()) return std::nullopt;
    return workerEndpoint_;
  }

  // The round's `recoveries` counter: add(1) gives this recovery its place; past the budget it
  // is taken off again (a node that raced past the budget too takes its own off).
  std::optional<int> spendRecovery() override {
    if (!lastRound_) throw InvalidArgument("spendRecovery() before a round formed");
    const std::string key = keys::recoveries(id(), *lastRound_);
    const int64_t n = store_->add(key, 1);
    if (restartCount_ + n > options().maxRestarts) {
      store_->add(key, -1);
      return std::nullopt;
    }
    return restartCount_ + static_cast<int>(n);
  }

  void refundRecovery() override {
    if (!lastRound_) throw InvalidArgument("refundRecovery() before a round formed");
    store_->add(keys::recoveries(id(), *lastRound_), -1);
  }

  std::vector<Vacancy> claimLostMembers() override {
    if (!lastRound_) throw InvalidArgument("claimLostMembers() before a round formed");
    return rdzv::claimLostMembers(*store_, id(), *lastRound_, node_.self.id);
  }

  void postVacancy(const Vacancy& vacancy, uint64_t generation, int restartCount) override {
    rdzv::postVacancy(*store_, id(), vacancy, generation, restartCount);
  }

  bool withdrawVacancy(const Vacancy& vacancy) override { return rdzv::withdrawVacancy(*store_, id(), vacancy); }

  // The count and a change in one batch: a watcher whose node finished before the drop looks
  // again (every member may have finished now), and leave() records the job's success.
  void dropMembers(int count) override {
    if (!lastRound_) throw InvalidArgument("dropMembers() before a round formed");
    StoreBatch batch;
    batch.add(keys::dropped(id(), *lastRound_), count);
    signalChange(batch, id(), *lastRound_,
                 "the survivors shrank round " + std::to_string(*lastRound_) + " without " + std::to_string(count) +
                     " lost node(s)");
    store_->runBatch(batch);
  }

  std::optional<Vacancy> claimGrowth(int nodeCount, int worldSize) override {
    if (!lastRound_) throw InvalidArgument("claimGrowth() before a round formed");
    return rdzv::claimGrowth(*store_, id(), *lastRound_, node_.self.id, nodeCount, worldSize, options().maxNodes);
  }

  void endGrowth(const Vacancy& place) override { rdzv::endGrowth(*store_, id(), place); }

  std::unique_ptr<LivenessStore> connectSideStore() override {
    return connect_ ? connect_() : nullptr;
  }

  void onWaitingForRunningJob(std::function<void()> callback) override { waitingForRunningJob_ = std::move(callback); }

  void onJobEvent(std::function<void(const JobEvent&)> callback) override {
    std::lock_guard lock(slot_->mutex);
    slot_->callback = [this, callback = std::move(callback)](const JobEvent& event) {
      if (event.kind == JobEvent::Kind::StoreLost) rejoin_.markLost();
      if (event.kind == JobEvent::Kind::Failed) rejoin_.noteFailed(event.round);
      if (callback) callback(event);
    };
  }

 private:
  const std::string& id() const { return node_.runId(); }

  // The in-process recoveries of round r so far (0 when none or unreadable: a corrupt counter
  // neither ends nor prolongs the job by itself).
  int recoveriesOf(uint64_t r) {
    try {
      return static_cast<int>(std::max<int64_t>(0, keys::parseCounter(store_->tryGet(keys::recoveries(id(), r))).value_or(0)));
    } catch (const ProtocolError& e) {
      spdlog::warn("rendezvous '{}': {}", id(), e.what());
      return 0;
    }
  }
  const RendezvousOptions& options() const { return node_.options; }

  keys::JobConfig myConfig() const {
    return {options().minNodes, options().maxNodes, node_.self.displayName(), options().maxRestarts};
  }

  // Every node of a job must be started with the same --nnodes and --max-restarts: the first one
  // to arrive records its values; a node started with others fails at once, naming both, instead
  // of waiting out the join timeout (--nnodes) or restarting by another budget (--max-restarts).
  // A job that has not formed yet fails for every waiting node with the same message (its open
  // round is decided as an error); a running job goes on without the odd node.
  // `stored`: what compare_set on `config` returned; `current`: the current round read after it.
  void checkJobConfig(const Bytes& stored, uint64_t current) {
    const keys::JobConfig mine = myConfig();
    const keys::JobConfig job = keys::parseJobConfig(stored);
    if (job.sameShape(mine) && job.maxRestarts == mine.maxRestarts) {
      configChecked_ = true;
      return;
    }
    auto shape = [](const keys::JobConfig& c) {
      return c.minNodes == c.maxNodes ? std::to_string(c.minNodes)
                                      : std::to_string(c.minNodes) + ":" + std::to_string(c.maxNodes);
    };
    const bool sameNodes = job.sameShape(mine);
    const std::string option = sameNodes ? "--max-restarts" : "--nnodes";
    const std::string ours = sameNodes ? std::to_string(mine.maxRestarts) : shape(mine);
    const std::string theirs = sameNodes ? std::to_string(job.maxRestarts) : shape(job);
    const std::string message = "nodes disagree on " + option + ": " + node_.self.displayName() + " has " +
                                option + " " + ours + ", the job (first started on " + job.setBy +
                                ") has " + option + " " + theirs + "; start every node with the same value";
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

  // Which round to join, and whom to tell.
  struct Start {
    uint64_t round = 0;
    Announcement announce;
  };

  // The job's entry, in one round trip: one batch of whether an earlier run with this id ended
  // (its `outcome`), its --nnodes checked against the job's and the current round read. An
  // outcome there (rare) is ExitBarrier::enter's to clear, and the batch runs again after it
  // (its config answer may be that run's). (This node counts itself in `present` with its will,
  // in its join's batch.)
  Start enterJob(const Deadline& deadline) {
    bool barrierPassed = !barrier_.mustEnter();
    for (;;) {
      StoreBatch batch;
      std::optional<size_t> outcome, config;
      if (!barrierPassed) outcome = batch.tryGet(keys::outcome(id()));
      if (!configChecked_)
        config = batch.compareSet(keys::config(id()), "", keys::encodeJobConfig(myConfig()));
      const size_t current = batch.tryGet(keys::currentRound(id()));
      store_->runBatch(batch);
      if (outcome && batch.value(*outcome)) {
        barrier_.enter(*store_, deadline);
        barrierPassed = true;
        continue;
      }
      const uint64_t round = keys::parseCounter(batch.value(current)).value_or(0);
      if (config) checkJobConfig(batch.value(*config).value_or(""), round);
      return startRound(round);
    }
  }

  Start startRound(uint64_t current) {
    Start start;
    start.round = current;
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
    auto state = RoundCloser(*store_, node_).closedRound(running);
    if (state) barrier_.throwIfJobEnded(*store_);  // (only a job that formed can have ended)
    // The nodes it runs with now: the decision's, less the ones a shrink dropped, plus the ones
    // a grow took in ("Elastic in place").
    const int64_t nodes = state ? state->nodeCount + resizedBy(running) : 0;
    if (state && nodes >= options().maxNodes) {
      spdlog::warn("rendezvous '{}': the job runs with {} node(s), the most it takes; {} waits as "
                   "a spare to replace a lost node",
                   id(), nodes, node_.self.displayName());
      return {};
    }
    return {running, "node " + node_.self.displayName() + " is waiting to join (round " +
                         std::to_string(running + 1) + ")"};
  }

  // grown - dropped of round `running`: how far the survivors resized it in place.
  int64_t resizedBy(uint64_t running) {
    StoreBatch reads;
    const size_t grown = reads.tryGet(keys::grown(id(), running));
    const size_t dropped = reads.tryGet(keys::dropped(id(), running));
    store_->runBatch(reads);
    return keys::parseCounter(reads.value(grown)).value_or(0) - keys::parseCounter(reads.value(dropped)).value_or(0);
  }

  RoundResult joinFrom(Start start, Deadline& deadline, Clock::time_point started) {
    uint64_t round = rejoin_.takeRefillRound().value_or(start.round);
    Announcement announce = std::move(start.announce);
    // Arrived while the job runs (announced, or a spare: the previous round closed).
    bool forRunningJob = !lastRound_ && round > 0;
    for (;;) {
      if (forRunningJob && waitingForRunningJob_) waitingForRunningJob_();
      RoundJoin join(*store_, node_, barrier_, round, forRunningJob);
      std::optional<Seat> seat = join.run(deadline, announce);
      if (auto moved = join.movedTo()) {  // the store was refilled by the survivors
        round = *moved;
        announce = {};
        forRunningJob = false;
        continue;
      }
      if (seat) {
        seat->result.continuesPrevious = rejoin_.carriesOn(*seat);
        const RoundResult& result = seat->result;
        if (seat->memberId) {  // a spare that took a lost member's place in the running round
          node_.self.id = *seat->memberId;
          node_.descriptorLine = keys::encodeDescriptor(node_.self);
        }
        lastRound_ = result.round;
        restartCount_ = result.restartCount;
        lastNodeCount_ = seat->decidedNodeCount > 0 ? seat->decidedNodeCount : result.nodeCount;
        lastNodeRank_ = result.nodeRank;
        lastWorldSize_ = result.worldSize;
        lastRosterDigest_ = seat->rosterDigest;
        spdlog::debug("rendezvous '{}': round {} formed in {}: node rank {} of {}, world size {}, "
                      "restart {}",
                      id(), round,
                      ms(std::chrono::duration_cast<milliseconds>(Clock::now() - started)),
                      result.nodeRank, result.nodeCount, result.worldSize, result.restartCount);
        startWatcher(*seat);
        return result;
      }
      // The round closed without this node: wait in the next one, and tell the running nodes
      // (unless the job is full: then this node is a spare).
      spdlog::debug("rendezvous '{}': round {} closed without this node; waiting for round {}",
                    id(), round, round + 1);
      announce = announcementFor(round);
      forRunningJob = true;
      ++round;
    }
  }

  void reconnectStore() {
    if (server_) throw NetworkError("rendezvous '" + id() + "': lost the store at " + node_.endpoint);
    store_.reset();
    store_ = rejoin_.reconnect(connect_, node_);
    barrier_.forget();  // its will counted it out of the job (or the store forgot the job)
    configChecked_ = false;
    // A store that restarted empty: this node carries its last round on (StoreRejoin::refill).
    const RanRound ran{lastRound_.value_or(0), std::max(restartCount_, knownRestarts_), lastNodeRank_,
                       lastNodeCount_, lastWorldSize_, lastRosterDigest_};
    if (lastRound_ && rejoin_.refill(*store_, id(), ran)) return;
    lastRound_.reset();  // the old round counted this node gone: it comes back as a newcomer
    // A newcomer under a new id: the old connection's will marked the old id dead in the round
    // it was joining, and a closer strikes every registration of a dead id (a node joining that
    // round again under it would be struck too: a MIN=MAX round could not form until the join
    // timeout). A will that runs late (a connection gone silent, a lease the other etcd sessions
    // see end later) then ends the old registration only, never the node that came back.
    node_.self.id = newNodeId();
    node_.self.rejoining = false;
    node_.self.previousRank.reset();
    node_.descriptorLine = keys::encodeDescriptor(node_.self);
  }

  void startWatcher(const Seat& seat) {
    if (!connect_) return;
    WatchedRound w;
    w.runId = id();
    w.round = seat.result.round;
    w.nodeCount = seat.decidedNodeCount > 0 ? seat.decidedNodeCount : seat.result.nodeCount;
    w.changesAtClose = seat.changesAtClose;
    w.leftAtClose = seat.leftAtClose;
    w.lostSeen = seat.lostSeen;
    w.endpoint = node_.endpoint;
    w.slice = watchSlice(options().heartbeatTimeout);
    try {
      watcher_ = std::make_unique<MembershipWatcher>(connect_(), std::move(w), slot_);
    } catch (const Error& e) {
      // This node cannot run the round it took (the store stalled past the watcher's hello): its
      // connection closes so that its will runs (lost: the others re-form without it, where a
      // clean leave() would have them wait for it to finish), and it joins again as a newcomer.
      store_.reset();
      rejoin_.markLost();
      throw NetworkError("the membership watcher could not connect: " + std::string(e.what()));
    }
  }

  void stopWatcher() { watcher_.reset(); }

  C10dNode node_;
  std::unique_ptr<LivenessStore> store_;
  std::function<std::unique_ptr<LivenessStore>()> connect_;
  std::unique_ptr<StoreServer> server_;
  std::string workerEndpoint_;  // the store as the workers reach it ("" = they cannot)
  std::shared_ptr<EventSlot> slot_;
  std::function<void()> waitingForRunningJob_;  // onWaitingForRunningJob's; the next() thread's
  ExitBarrier barrier_;
  std::unique_ptr<MembershipWatcher> watcher_;
  PortReservation reservation_;
  StoreRejoin rejoin_;  // losing the store, and coming back
  std::optional<uint64_t> lastRound_;
  int restartCount_ = 0;
  int knownRestarts_ = 0;  // the count the agent knows at a store loss (its in-process recoveries)
  int64_t lastNodeCount_ = 0;
  int lastNodeRank_ = 0;
  int lastWorldSize_ = 0;
  uint64_t lastRosterDigest_ = 0;  // 0: not known (a place taken from a spare's wait)
  bool left_ = false;
  bool configChecked_ = false;
};

}  // namespace

std::unique_ptr<Rendezvous> makeC10dRendezvous(const RendezvousOptions& options,
                                               C10dStoreAccess access) {
  return std::make_unique<C10dRendezvous>(options, std::move(access));
}

}  // namespace drun::rdzv

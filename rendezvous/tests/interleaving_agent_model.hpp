// The agent model's behaviour (Node's methods): see interleaving_harness.hpp. Included by it
// only.
#pragma once

namespace drun::rdzv::test {

inline Node::Node(Cluster& cluster, std::string name, RendezvousOptions options)
    : cluster_(cluster), name_(std::move(name)), options_(std::move(options)) {
  link_ = std::make_shared<NodeLink>(name_, cluster_.hook, [&c = cluster_] { c.notify(); });
  C10dStoreAccess access;
  Connector connect = cluster_.backend->connector(link_, options_);
  access.store = connect();
  access.connectWatcher = std::move(connect);
  access.endpoint = cluster_.backend->endpoint();
  rdzv_ = makeC10dRendezvous(options_, std::move(access));
  rdzv_->onJobEvent([this](const JobEvent& e) {
    {
      std::lock_guard lock(cluster_.mutex);
      pending_.push_back(e);
      seenEvents.push_back(e);
      cluster_.noteLocked(name_ + " told " + toString(e.kind) + "@" + std::to_string(e.round) +
                          ": " + e.reason);
    }
    cluster_.changed.notify_all();
  });
}

inline Node::~Node() {
  if (thread_.joinable()) thread_.join();
}

inline void Node::start() {
  {
    std::lock_guard lock(cluster_.mutex);
    phase = Phase::Joining;
  }
  thread_ = std::thread([this] {
    try {
      run();
    } catch (const std::exception& e) {  // no exception may end a thread (std::terminate)
      end(Ending::Error, 1, std::string("agent model: ") + e.what());
      rdzv_.reset();
    }
  });
}

inline void Node::requestFinish() {
  {
    std::lock_guard lock(cluster_.mutex);
    finishRequested_ = true;
  }
  cluster_.notify();
}

inline void Node::requestFailure(int exitCode) {
  {
    std::lock_guard lock(cluster_.mutex);
    failRequested_ = true;
    failCode_ = exitCode;
  }
  cluster_.notify();
}

template <typename F>
auto Node::call(const char* what, F&& f) {
  link_->beginCall(what);
  struct End {
    NodeLink& link;
    ~End() { link.endCall(); }
  } endCall{*link_};
  return f();
}

inline void Node::end(Ending how, int code, const std::string& text) {
  {
    std::lock_guard lock(cluster_.mutex);
    if (link_->refused()) how = Ending::Dead;  // whatever it saw, it was killed
    cluster_.closeIntervalLocked(name_);
    cluster_.noteLocked(name_ + " ended " + toString(how));
    ending = how;
    exitCode = code;
    endText = text;
    phase = Phase::Ended;
  }
  cluster_.notify();
}

inline void Node::leaveQuietly() {
  try {
    call("leave", [&] { rdzv_->leave(); });
  } catch (const std::exception&) {
    // leave() never throws; a model must not end on it either
  }
}

inline void Node::run() {
  for (;;) {
    RoundResult r;
    try {
      r = call("join", [&] { return rdzv_->next(); });
    } catch (const JobEnded& e) {
      // As the agent: a spare or a late joiner leaves as a known node of the job.
      leaveQuietly();
      end(Ending::JobEnded, e.exitCode(), e.what());
      break;
    } catch (const std::exception& e) {
      leaveQuietly();  // as the agent: clean, so a store host would still serve the others
      end(Ending::Error, 1, e.what());
      break;
    }
    {
      std::lock_guard lock(cluster_.mutex);
      if (!link_->refused()) {
        cluster_.intervals.push_back({name_, r, Clock::now()});
        phase = Phase::Running;
        round = r.round;
      }
    }
    cluster_.notify();
    if (link_->refused()) {
      end(Ending::Dead, 137, "killed");
      break;
    }
    if (!runRound(r)) break;
    // Stopping the workers takes a while (SIGTERM, grace): they run until then.
    std::unique_lock lock(cluster_.mutex);
    cluster_.changed.wait_for(lock, stopTime, [&] { return link_->refused(); });
    cluster_.closeIntervalLocked(name_);
    phase = Phase::Joining;
  }
  // The agent exits: the rendezvous goes (its will runs unless it left).
  rdzv_->onJobEvent(nullptr);
  rdzv_.reset();
}

// Waits (under `lock`) until this node is killed, an event of round r or later arrives, more()
// holds or `until`; takes the events. Returns false when the node was killed (it has ended).
template <typename More>
bool Node::awaitNews(std::unique_lock<std::mutex>& lock, const RoundResult& r,
                     Clock::time_point until, std::vector<JobEvent>& events, More more) {
  cluster_.changed.wait_until(lock, until,
                              [&] { return link_->refused() || !pending_.empty() || more(); });
  if (link_->refused()) {
    lock.unlock();
    end(Ending::Dead, 137, "killed");
    return false;
  }
  events = std::move(pending_);
  pending_.clear();
  std::erase_if(events, [&](const JobEvent& e) { return e.round < r.round; });  // old news
  return true;
}

// Runs round r until something stops it. Returns true to join again.
inline bool Node::runRound(const RoundResult& r) {
  const Deadline stuck(kStuck);
  Clock::time_point scaleUpAt = Clock::time_point::max();
  for (;;) {
    std::unique_lock lock(cluster_.mutex);
    std::vector<JobEvent> events;
    if (!awaitNews(lock, r, std::min(scaleUpAt, stuck.when()), events, [&] {
          return finishRequested_ || failRequested_ || Clock::now() >= scaleUpAt;
        }))
      return false;
    for (const JobEvent& e : events) {
      switch (e.kind) {
        case JobEvent::Kind::Failed:
          cluster_.causes.push_back({name_, e.round, *e.failure});
          if (e.failure->final) {
            lock.unlock();
            call("leave", [&] { rdzv_->leave(); });
            end(Ending::Failed, e.failure->statusCode(), "the job failed");
            return false;
          }
          return true;
        case JobEvent::Kind::MemberLost:
        case JobEvent::Kind::StoreLost:
          return true;
        case JobEvent::Kind::NodeWaiting:
          if (scaleUpAt == Clock::time_point::max())
            scaleUpAt = Clock::now() + options_.lastCallTimeout;
          break;
        case JobEvent::Kind::Succeeded: break;  // not before this node finished
      }
    }
    if (Clock::now() >= scaleUpAt) {
      // As the agent: the round is claimed before the workers stop; refused (a member finished
      // first), they go on and the waiting nodes learn the job's end.
      lock.unlock();
      bool claimed = false;
      try {
        claimed = call("claim", [&] { return rdzv_->claimScaleUp(); });
      } catch (const std::exception&) {
        // as the agent: refused; a lost store comes as StoreLost
      }
      if (claimed) return true;
      std::lock_guard relock(cluster_.mutex);
      cluster_.noteLocked(name_ + " keeps running round " + std::to_string(r.round) +
                          " (a member finished it)");
      scaleUpAt = Clock::time_point::max();
      continue;
    }
    if (failRequested_) {
      failRequested_ = false;
      cluster_.closeIntervalLocked(name_);
      lock.unlock();
      FailureRecord mine;
      mine.rank = r.rankOffset;
      mine.exitCode = failCode_;
      FailureRecord cause;
      try {
        cause = call("report", [&] { return rdzv_->reportFailure(mine); });
      } catch (const std::exception& e) {
        // As the agent: nobody can be told; the job ends here with this node's own cause.
        end(Ending::Failed, mine.statusCode(), std::string("could not report: ") + e.what());
        return false;
      }
      {
        std::lock_guard relock(cluster_.mutex);
        cluster_.causes.push_back({name_, r.round, cause});
      }
      if (!cause.final) return true;
      call("leave", [&] { rdzv_->leave(); });
      end(Ending::Failed, cause.statusCode(), "the job failed");
      return false;
    }
    if (finishRequested_) {
      cluster_.closeIntervalLocked(name_);
      phase = Phase::Finishing;
      lock.unlock();
      cluster_.notify();
      try {
        // As the agent: false, a member took waiting nodes in first: re-form with it.
        if (!call("finish", [&] { return rdzv_->finish(); })) return true;
      } catch (const std::exception&) {
        return true;  // as the agent: the store was lost in the barrier (StoreLost): join again
      }
      {
        std::lock_guard relock(cluster_.mutex);
        finishReturned = true;
        cluster_.noteLocked(name_ + " finished round " + std::to_string(r.round));
      }
      cluster_.notify();
      return barrier(r);
    }
    if (stuck.expired()) {
      lock.unlock();
      end(Ending::Stuck, 1, "ran round " + std::to_string(r.round) + " for " +
                                std::to_string(kStuck.count()) + " s with no event");
      return false;
    }
  }
}

// The exit barrier after finish(): Succeeded ends the node; a loss or failure re-forms.
inline bool Node::barrier(const RoundResult& r) {
  const Deadline stuck(kStuck);
  for (;;) {
    std::unique_lock lock(cluster_.mutex);
    std::vector<JobEvent> events;
    if (!awaitNews(lock, r, stuck.when(), events, [] { return false; })) return false;
    for (const JobEvent& e : events) {
      if (e.kind == JobEvent::Kind::NodeWaiting) continue;
      if (e.kind == JobEvent::Kind::Failed) cluster_.causes.push_back({name_, e.round, *e.failure});
      lock.unlock();
      if (e.kind == JobEvent::Kind::Succeeded) {
        call("leave", [&] { rdzv_->leave(); });
        end(Ending::Succeeded, 0, "");
        return false;
      }
      if (e.kind == JobEvent::Kind::Failed && e.failure->final) {
        call("leave", [&] { rdzv_->leave(); });
        end(Ending::Failed, e.failure->statusCode(), "the job failed");
        return false;
      }
      return true;  // MemberLost, StoreLost, a failure with budget left: re-form
    }
    if (stuck.expired()) {
      lock.unlock();
      end(Ending::Stuck, 1, "waited " + std::to_string(kStuck.count()) +
                                " s in the exit barrier of round " + std::to_string(r.round));
      return false;
    }
  }
}

}  // namespace drun::rdzv::test

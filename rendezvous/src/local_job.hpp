// LocalJob: the job-wide part of a rendezvous that has no store (single node, static backend).
// This node alone keeps the restart count (restarts and in-process recoveries), and a failure or success is known only here: with
// the static backend every node counts its own restarts, as torchrun's static backend does.
//
// Threading: the agent's rendezvous thread calls everything; finish() delivers the Succeeded
// event on that thread.
#pragma once

#include <functional>
#include <mutex>

#include "drun/rendezvous/rendezvous.hpp"

namespace drun::rdzv {

class LocalJob : public Rendezvous {
 public:
  explicit LocalJob(int maxRestarts) : maxRestarts_(maxRestarts) {}

  FailureRecord reportFailure(const FailureRecord& failure) override {
    FailureRecord cause = failure;
    cause.final = failure.final || restartCount_ + recoveries_ >= maxRestarts_;
    failedRound_ = true;
    return cause;
  }

  std::optional<int> spendRecovery() override {
    if (restartCount_ + recoveries_ >= maxRestarts_) return std::nullopt;
    return restartCount_ + ++recoveries_;
  }

  void refundRecovery() override {
    if (recoveries_ > 0) --recoveries_;
  }

  // Nobody waits to join a job without a store: there is no scale-up to race with.
  bool claimScaleUp() override { return true; }

  bool finish() override {
    JobEvent event;
    event.kind = JobEvent::Kind::Succeeded;
    event.round = lastRound_;
    event.reason = "every worker succeeded";
    std::function<void(const JobEvent&)> callback;
    {
      std::lock_guard lock(mutex_);
      callback = callback_;
    }
    if (callback) callback(event);
    return true;
  }

  void abandon() override { leave(); }

  void onJobEvent(std::function<void(const JobEvent&)> callback) override {
    std::lock_guard lock(mutex_);
    callback_ = std::move(callback);
  }

 protected:
  // Called by next(): the round number and restart count of the round it returns.
  void beginRound(RoundResult& result) {
    restartCount_ += recoveries_ + (failedRound_ ? 1 : 0);
    recoveries_ = 0;
    failedRound_ = false;
    result.round = lastRound_ = nextRound_++;
    result.restartCount = restartCount_;
  }

 private:
  std::mutex mutex_;
  std::function<void(const JobEvent&)> callback_;
  const int maxRestarts_;  // the job's restart budget
  uint64_t nextRound_ = 0;
  uint64_t lastRound_ = 0;
  int restartCount_ = 0;
  int recoveries_ = 0;  // in-process recoveries of the current round (each a unit of the budget)
  bool failedRound_ = false;
};

}  // namespace drun::rdzv

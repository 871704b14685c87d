// The Request states the front end (Communicator::Impl) makes itself: a queued or asynchronous
// collective (AsyncWork), an operation with nothing to do, and a backend's point-to-point request
// wrapped with the front end's error translation. Internal to libdrun_comm.
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "communicator_impl.hpp"

namespace drun::comm::detail {

// A collective queued behind others, or run on the worker thread for an ...Async call.
class AsyncWork final : public Request::State {
 public:
  AsyncWork(std::shared_ptr<Communicator::Impl> owner, Collective c)
      : owner_(std::move(owner)), c_(c), deadline_(c.timeout) {}

  void run() {
    std::exception_ptr error;
    try {
      Collective c = c_;  // the time left of the deadline set when it was called
      c.timeout = std::max(deadline_.remaining(), milliseconds(1));
      owner_->throwIfBroken(toString(c.kind));  // broken while it was queued: fail at once
      owner_->execute(c);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard lock(mutex_);
    error_ = error;
    done_ = true;
    cv_.notify_all();
  }

  void wait(milliseconds timeout) override {
    // The worker finishes every operation by its deadline (the transport enforces it); the
    // slack covers the operations queued before this one.
    Deadline limit = timeout == kDefaultTimeout ? Deadline::at(deadline_.when() + kSlack)
                                                : Deadline(timeout);
    std::unique_lock lock(mutex_);
    if (!cv_.wait_until(lock, limit.when(), [&] { return done_; }))
      throw TimeoutError(std::string("wait for ") + toString(c_.kind) + " timed out after " +
                         std::to_string((timeout == kDefaultTimeout ? c_.timeout : timeout).count()) +
                         "ms");
    if (error_) std::rethrow_exception(error_);
  }

  bool test() override {
    std::lock_guard lock(mutex_);
    if (done_ && error_) std::rethrow_exception(error_);
    return done_;
  }

 private:
  static constexpr milliseconds kSlack{5000};
  std::shared_ptr<Communicator::Impl> owner_;
  Collective c_;
  Deadline deadline_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// An operation with nothing to do (zero elements).
class CompletedRequest final : public Request::State {
 public:
  void wait(milliseconds) override {}
  bool test() override { return true; }
};

// A backend's point-to-point request, with the front end's error translation.
class P2PRequest final : public Request::State {
 public:
  // generation: the communicator's when the request was made.
  P2PRequest(std::shared_ptr<Communicator::Impl> owner, std::shared_ptr<Request::State> inner,
             const char* what, uint64_t generation)
      : owner_(std::move(owner)), inner_(std::move(inner)), what_(what), generation_(generation) {}

  void wait(milliseconds timeout) override {
    try {
      inner_->wait(timeout);
    } catch (...) {
      owner_->fail(what_, std::current_exception(), {}, generation_);
    }
  }
  bool test() override {
    try {
      return inner_->test();
    } catch (...) {
      owner_->fail(what_, std::current_exception(), {}, generation_);
    }
  }
  int source() const override { return inner_->source(); }

 private:
  std::shared_ptr<Communicator::Impl> owner_;
  std::shared_ptr<Request::State> inner_;
  const char* what_;
  uint64_t generation_;
};

}  // namespace drun::comm::detail

#include "collective_work.hpp"

#include <ATen/core/ivalue.h>
#include <sched.h>

#include <string>

namespace drun::torch_backend {

CollectiveWork::CollectiveWork(int rank, c10d::OpType type, const char* call,
                               std::vector<at::Tensor> outputs)
    : Work(rank, type),
      call_(call),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {}

void CollectiveWork::run(const std::function<void()>& collective) {
  std::exception_ptr error;
  try {
    collective();
  } catch (const c10::Error&) {  // torch's own checks: already a RuntimeError naming the call
    error = std::current_exception();
  } catch (const std::exception& e) {  // drun's: its message, as torch's RuntimeError
    error = std::make_exception_ptr(std::runtime_error(e.what()));
  } catch (...) {
    error = std::make_exception_ptr(
        std::runtime_error(std::string("drun backend: ") + call_ + ": unknown error"));
  }
  finish(error);  // wait() returns; the Future completes in complete()
}

void CollectiveWork::complete() {
  std::exception_ptr error;
  {
    std::lock_guard lock(mutex_);
    error = exception_;
  }
  if (error)
    future_->setError(error);
  else
    future_->markCompleted(c10::IValue(outputs_));
}

void CollectiveWork::fail(const std::string& message) {
  auto error = std::make_exception_ptr(std::runtime_error(message));
  finish(error);
  future_->setError(error);
}

bool CollectiveWork::isSuccess() const {
  std::lock_guard lock(mutex_);
  return completed_ && !exception_;
}

void CollectiveWork::setShortcut(std::function<bool()> runHere) {
  std::lock_guard lock(mutex_);
  runHere_ = std::move(runHere);
}

bool CollectiveWork::wait(std::chrono::milliseconds timeout) {
  std::function<bool()> runHere;
  {
    std::lock_guard lock(mutex_);
    if (!completed_) runHere = runHere_;
  }
  // Only without a timeout of the caller's own: the collective's own deadline bounds the run.
  if (runHere && timeout == kNoTimeout) runHere();
  // A shared-memory collective takes microseconds; a sleep on the condition variable costs a
  // wake-up (tens of microseconds under load): poll first, yielding the core to the queue's thread.
  const auto start = std::chrono::steady_clock::now();
  auto poll = kPollBeforeSleep;
  if (timeout != kNoTimeout) poll = std::min<std::chrono::microseconds>(poll, timeout);
  while (!isCompleted() && std::chrono::steady_clock::now() - start < poll) sched_yield();
  std::unique_lock lock(mutex_);
  if (timeout == kNoTimeout) {
    cv_.wait(lock, [&] { return completed_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
    throw std::runtime_error(std::string("drun backend: ") + call_ + ": wait(" +
                             std::to_string(timeout.count()) +
                             " ms) ran out before the collective finished (it goes on)");
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

}  // namespace drun::torch_backend

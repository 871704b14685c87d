#include "drun_work.hpp"

#include <ATen/core/ivalue.h>

namespace drun::torch_backend {

namespace {

c10::intrusive_ptr<c10::ivalue::Future> newFuture() {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}

}  // namespace

DrunWork::DrunWork(int rank, c10d::OpType type, comm::Request request,
                   std::vector<at::Tensor> outputs, std::function<void()> finish,
                   std::function<std::string(const std::exception&)> describe)
    : Work(rank, type),
      describe_(std::move(describe)),
      request_(std::move(request)),
      pending_(true),
      outputs_(std::move(outputs)),
      finish_(std::move(finish)),
      future_(newFuture()) {}

// drun's errors reach Python as RuntimeError with drun's message ("rank 2 (pid 77) is gone"),
// and the ranks the heartbeats no longer hear.
std::exception_ptr DrunWork::failure(const std::exception& e) const {
  return std::make_exception_ptr(std::runtime_error(describe_(e)));
}

void DrunWork::complete(std::exception_ptr error) {
  pending_ = false;
  if (!error && finish_) {
    try {
      finish_();
    } catch (const std::exception& e) {
      error = failure(e);
    }
  }
  finish_ = nullptr;
  error_ = error;
  if (error)
    future_->setError(error);
  else
    future_->markCompleted(c10::IValue(outputs_));
}

bool DrunWork::isCompleted() {
  std::lock_guard lock(stateMutex_);
  if (!pending_) return true;
  try {
    if (!request_.test()) return false;
    complete(nullptr);
  } catch (const std::exception& e) {
    complete(failure(e));
  }
  return true;
}

bool DrunWork::isSuccess() const {
  std::lock_guard lock(stateMutex_);
  return !pending_ && !error_;
}

std::exception_ptr DrunWork::exception() const {
  std::lock_guard lock(stateMutex_);
  return error_;
}

int DrunWork::sourceRank() const {
  std::lock_guard lock(stateMutex_);
  return request_.valid() ? request_.source() : -1;
}

std::vector<at::Tensor> DrunWork::result() {
  std::lock_guard lock(stateMutex_);
  return outputs_;
}

bool DrunWork::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(stateMutex_);
  if (pending_) {
    try {
      // torch's kNoTimeout (0): the operation's own deadline.
      request_.wait(timeout.count() <= 0 ? comm::kDefaultTimeout : timeout);
      complete(nullptr);
    } catch (const drun::TimeoutError& e) {
      if (timeout.count() > 0) {  // the caller's shorter wait ran out: the operation goes on
        throw std::runtime_error(std::string("drun backend: ") + e.what());
      }
      complete(failure(e));
    } catch (const std::exception& e) {
      complete(failure(e));
    }
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> DrunWork::getFuture() {
  std::lock_guard lock(stateMutex_);
  return future_;
}

}  // namespace drun::torch_backend

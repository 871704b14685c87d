// DrunWork: the c10d::Work of ProcessGroupDrun's point-to-point operations (collectives return a
// CollectiveWork). A Work over a pending drun::comm::Request, started on the caller's thread:
// wait(timeout) and isCompleted() drive it, then copy a staged receive back into the caller's
// tensor (once). As with ProcessGroupGloo's send/recv work, nothing completes it in the
// background: its Future completes when wait() or isCompleted() saw the request done. A failure is kept as the Work's exception and raised by wait() as torch's
// RuntimeError with drun's message.
//
// Threading: wait/isCompleted may be called from any thread; one mutex guards the state.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>
#include <mutex>

#include "drun/comm/communicator.hpp"

namespace drun::torch_backend {

class DrunWork final : public c10d::Work {
 public:
  // `finish` runs once when `request` completed without error; `outputs` live until then and
  // are the Future's value; `describe` makes the RuntimeError's message of a failure.
  DrunWork(int rank, c10d::OpType type, comm::Request request, std::vector<at::Tensor> outputs,
           std::function<void()> finish,
           std::function<std::string(const std::exception&)> describe);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override {}
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  std::exception_ptr failure(const std::exception& e) const;
  // Called with the mutex held once the request is done (or failed with `error`).
  void complete(std::exception_ptr error);

  const std::function<std::string(const std::exception&)> describe_;
  mutable std::mutex stateMutex_;
  comm::Request request_;
  bool pending_ = false;
  std::exception_ptr error_;
  std::vector<at::Tensor> outputs_;
  std::function<void()> finish_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace drun::torch_backend

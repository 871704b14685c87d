// CollectiveWork: the c10d::Work of a collective queued on a ProcessGroupDrun's CollectiveQueue.
//
// Returned at once by the call that queued it; the queue runs it in two parts: run() executes the
// collective and completes the Work (wait() returns), then complete() completes its Future (whose
// value is the output tensors: DDP's reducer and comm hooks chain on it, their callbacks run in
// complete(), on the queue's thread or a waiter's; a collective they issue runs inline there, see
// CollectiveQueue). fail() ends a collective that never started (the queue was held too long by
// another's callbacks). A wait() for a collective nobody started yet runs it on the waiting thread
// (see CollectiveQueue). The task holds the tensors it uses, so they live until the collective is
// done. wait(timeout) blocks until then and rethrows the collective's error (a RuntimeError with
// drun's message); a wait whose own timeout runs out raises without ending the collective.
// isCompleted / isSuccess / exception report the state without blocking.
//
// Threading: any thread may wait or query; run() and complete(), or fail(), are called once, by
// the queue.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <functional>

namespace drun::torch_backend {

class CollectiveWork final : public c10d::Work {
 public:
  // `call` names the collective in errors ("all_reduce").
  CollectiveWork(int rank, c10d::OpType type, const char* call, std::vector<at::Tensor> outputs);

  // Runs `collective` (on the queue's thread, or a waiter's), then completes this Work.
  void run(const std::function<void()>& collective);
  // Completes the Future with run()'s result: its callbacks run now, on this thread.
  void complete();
  // Fails the Work and its Future with `message` (a RuntimeError): the collective never ran.
  void fail(const std::string& message);
  // What wait() tries first: run the queued collective on the waiting thread if nobody has
  // started it and it is next (CollectiveQueue::runIfNext); true if it ran.
  void setShortcut(std::function<bool()> runHere);

  bool isSuccess() const override;
  std::vector<at::Tensor> result() override { return outputs_; }
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  // How long wait() polls (yielding) before it sleeps on the condition variable.
  static constexpr std::chrono::microseconds kPollBeforeSleep{200};

  const char* call_;
  std::function<bool()> runHere_;  // guarded by mutex_
  const std::vector<at::Tensor> outputs_;
  const c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace drun::torch_backend

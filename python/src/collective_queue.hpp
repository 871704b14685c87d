// CollectiveQueue: the one thread on which a ProcessGroupDrun runs its collectives, in the order
// they were issued (which is the same on every rank, as libdrun_comm requires), so that each call
// returns its Work at once and the caller (DDP's backward pass) computes while the data moves.
// This is ProcessGroupGloo's design with one worker: torch issues a group's collectives in one
// order on every rank, and one FIFO thread keeps it.
//
// Threading: push() from any thread; tasks run one at a time on the queue's thread and must not
// throw (CollectiveWork::run catches). The destructor runs what is still queued (each task is
// bounded by its operation's timeout), then joins the thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace drun::torch_backend {

class CollectiveQueue {
 public:
  CollectiveQueue();
  ~CollectiveQueue();
  CollectiveQueue(const CollectiveQueue&) = delete;
  CollectiveQueue& operator=(const CollectiveQueue&) = delete;

  void push(std::function<void()> task);

 private:
  void loop();

  // How long the idle thread polls (yielding) for the next task before it sleeps.
  static constexpr std::chrono::microseconds kPollBeforeSleep{200};

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  std::atomic<size_t> queued_{0};  // tasks_.size(), read without the mutex while polling
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace drun::torch_backend

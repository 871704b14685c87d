// CollectiveQueue: runs a ProcessGroupDrun's collectives one at a time in the order they were
// issued (which is the same on every rank, as libdrun_comm requires), so that each call returns
// its Work at once and the caller (DDP's backward pass) computes while the data moves. This is
// ProcessGroupGloo's design with one worker thread, plus one shortcut: a caller that waits for a
// task nobody has started yet, at the head of the queue, runs it itself (runIfNext), so that a
// synchronous collective (torch waits at once) costs no thread hand-off (two wake-ups, tens of
// microseconds on a loaded machine: more than a shared-memory all_reduce). Order is kept either
// way: only the head runs, and never beside another task.
//
// Threading: push() and runIfNext() from any thread; tasks run one at a time and must not throw
// (CollectiveWork::run catches). The destructor runs what is still queued (each task is bounded
// by its operation's timeout), then joins the thread.
#pragma once

#include <condition_variable>
#include <cstdint>
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

  // Queues `task`; returns its id for runIfNext.
  uint64_t push(std::function<void()> task);
  // Runs task `id` on this thread if it is next and nothing runs; false if it started already
  // (or ran), or tasks before it are pending.
  bool runIfNext(uint64_t id);

 private:
  struct Task {
    uint64_t id;
    std::function<void()> run;
  };
  void loop();
  // Runs `task` (the lock released meanwhile), then marks the queue free again.
  void runLocked(std::unique_lock<std::mutex>& lock, Task task);

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<Task> tasks_;
  uint64_t nextId_ = 0;
  bool running_ = false;  // a task runs (on the queue's thread or a waiter's)
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace drun::torch_backend

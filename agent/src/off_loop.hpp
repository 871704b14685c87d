// OffLoop: one thread that runs the agent's blocking calls (the rendezvous' store calls: join,
// report a failure, finish, leave) in order, so that the event loop never blocks on the network.
// Each call has its own deadline inside the rendezvous; results go back to the loop as posted
// handlers.
//
// Threading: post() from the loop thread; tasks run on the OffLoop thread (an OwnedThread:
// signals blocked), one at a time.
// Ownership: stop(bound) runs the tasks already queued and joins the thread within `bound`; a
// task still blocked then is left running (OwnedThread::join). Its owner must then keep the
// OffLoop and what the task uses alive (the agent keeps its whole state: Impl::leftRunning). The
// destructor stops with OwnedThread::kDefaultJoinBound when stop() was not called.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>

#include "drun/common/owned_thread.hpp"

namespace drun::agent {

class OffLoop {
 public:
  OffLoop() : thread_("rendezvous calls", [this] { run(); }) {}
  ~OffLoop() { stop(OwnedThread::kDefaultJoinBound); }
  OffLoop(const OffLoop&) = delete;
  OffLoop& operator=(const OffLoop&) = delete;

  // The task must not throw: wrap its body (the agent turns errors into events).
  void post(std::function<void()> task) {
    {
      std::lock_guard lock(mutex_);
      tasks_.push_back(std::move(task));
      busy_ = true;
    }
    wake_.notify_one();
  }

  // A task is queued or running.
  bool busy() const { return busy_.load(); }

  // Ends the thread once the queue is empty; false when it was still busy after `bound` (left
  // running, see above).
  bool stop(std::chrono::milliseconds bound) {
    {
      std::lock_guard lock(mutex_);
      closing_ = true;
    }
    wake_.notify_one();
    return thread_.join(bound);
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return closing_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // closing, nothing left
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      try {
        task();
      } catch (...) {
        // Tasks report their own errors; nothing may end this thread.
      }
      lock.lock();
      busy_ = !tasks_.empty();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;
  bool closing_ = false;
  std::atomic<bool> busy_{false};
  OwnedThread thread_;  // last: it starts once the members above exist
};

}  // namespace drun::agent

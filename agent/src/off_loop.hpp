// OffLoop: one thread that runs the agent's blocking calls (the rendezvous' store calls: join,
// report a failure, finish, leave) in order, so that the event loop never blocks on the network.
// Each call has its own deadline inside the rendezvous; results go back to the loop as posted
// handlers.
//
// Threading: post() from the loop thread; tasks run on the OffLoop thread, one at a time.
// Ownership: the destructor runs the tasks already queued and joins the thread, unless a task is
// stuck (busy()): the agent then leaves through _exit (nothing of the job runs any more).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace drun::agent {

class OffLoop {
 public:
  OffLoop() : thread_([this] { run(); }) {}
  ~OffLoop() {
    {
      std::lock_guard lock(mutex_);
      closing_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }
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
  std::thread thread_;
};

}  // namespace drun::agent

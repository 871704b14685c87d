#include "collective_queue.hpp"

#include <sched.h>

namespace drun::torch_backend {

CollectiveQueue::CollectiveQueue() : thread_([this] { loop(); }) {}

CollectiveQueue::~CollectiveQueue() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_one();
  thread_.join();
}

void CollectiveQueue::push(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    tasks_.push_back(std::move(task));
    queued_.fetch_add(1, std::memory_order_release);
  }
  ready_.notify_one();
}

void CollectiveQueue::loop() {
  for (;;) {
    std::function<void()> task;
    // Back-to-back collectives (a training loop's, or synchronous ones, where torch waits at once)
    // find this thread still polling: a sleep on the condition variable costs a wake-up, tens of
    // microseconds on a loaded machine, more than a shared-memory collective. Yielding keeps the
    // core for whoever needs it.
    const auto pollUntil = std::chrono::steady_clock::now() + kPollBeforeSleep;
    while (queued_.load(std::memory_order_acquire) == 0 &&
           std::chrono::steady_clock::now() < pollUntil)
      sched_yield();
    {
      std::unique_lock lock(mutex_);
      ready_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and everything queued ran
      task = std::move(tasks_.front());
      tasks_.pop_front();
      queued_.fetch_sub(1, std::memory_order_release);
    }
    try {
      task();
    } catch (...) {  // tasks catch their own errors; nothing may end this thread
    }
  }
}

}  // namespace drun::torch_backend

#include "collective_queue.hpp"
#include "drun/common/owned_thread.hpp"

namespace drun::torch_backend {

CollectiveQueue::CollectiveQueue() : thread_(spawnThreadWithSignalsBlocked([this] { loop(); })) {}

CollectiveQueue::~CollectiveQueue() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  thread_.join();
}

uint64_t CollectiveQueue::push(std::function<void()> task) {
  uint64_t id;
  {
    std::lock_guard lock(mutex_);
    id = nextId_++;
    tasks_.push_back({id, std::move(task)});
  }
  ready_.notify_all();
  return id;
}

bool CollectiveQueue::runIfNext(uint64_t id) {
  std::unique_lock lock(mutex_);
  if (running_ || tasks_.empty() || tasks_.front().id != id) return false;
  Task task = std::move(tasks_.front());
  tasks_.pop_front();
  runLocked(lock, std::move(task));
  return true;
}

void CollectiveQueue::runLocked(std::unique_lock<std::mutex>& lock, Task task) {
  running_ = true;
  lock.unlock();
  try {
    task.run();
  } catch (...) {  // tasks catch their own errors; nothing may end this thread
  }
  task.run = nullptr;  // drops the tensors before the next task starts
  lock.lock();
  running_ = false;
  lock.unlock();
  ready_.notify_all();  // the queue's thread may wait for the queue to be free
  lock.lock();
}

void CollectiveQueue::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    ready_.wait(lock, [&] { return (stopping_ && !running_) || (!tasks_.empty() && !running_); });
    if (tasks_.empty()) return;  // stopping, and everything queued ran
    Task task = std::move(tasks_.front());
    tasks_.pop_front();
    runLocked(lock, std::move(task));
  }
}

}  // namespace drun::torch_backend

#include "collective_queue.hpp"

#include <cxxabi.h>

#include <algorithm>
#include <utility>

#include "drun/common/owned_thread.hpp"

namespace drun::torch_backend {

namespace {

// The queue whose task runs on this thread right now (its collective or its callbacks).
thread_local CollectiveQueue* queueRunningHere = nullptr;

void failTask(CollectiveQueue::Task& task, const std::string& reason) {
  if (task.fail) task.fail(std::string("drun backend: ") + task.call + ": " + reason);
}

// Runs one part of a task: its parts catch their own errors, and nothing may end the thread. A
// thread that Python ends while it takes the GIL at exit unwinds through here: let it.
void runPart(const std::function<void()>& part) {
  try {
    part();
  } catch (const abi::__forced_unwind&) {
    throw;
  } catch (...) {
  }
}

}  // namespace

CollectiveQueue::CollectiveQueue()
    : thread_(spawnThreadWithSignalsBlocked([this] { loop(); })),
      watchdog_(spawnThreadWithSignalsBlocked([this] { watch(); })) {}

CollectiveQueue::~CollectiveQueue() { stop(); }

void CollectiveQueue::stop() {
  if (::getpid() != owner_) {
    // A forked child (a DataLoader worker) holds a copy of this queue but none of its threads,
    // and maybe a copy of its mutex taken: nothing to run, nothing to join.
    if (thread_.joinable()) thread_.detach();
    if (watchdog_.joinable()) watchdog_.detach();
    return;
  }
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    // What is queued still runs; what comes later would wait for a thread that is gone.
    if (broken_.empty()) broken_ = "the group's queue stopped (the process is exiting)";
  }
  ready_.notify_all();
  watched_.notify_all();
  thread_.join();
  watchdog_.join();
}

uint64_t CollectiveQueue::push(Task task) {
  std::unique_lock lock(mutex_);
  const uint64_t id = nextId_++;
  if (queueRunningHere == this) {  // a callback of this queue's task issued it: run it now
    lock.unlock();
    runParts(task);
    return id;
  }
  if (!broken_.empty()) {
    const std::string reason = broken_;
    lock.unlock();
    failTask(task, reason);
    return id;
  }
  tasks_.push_back({id, Clock::now(), std::move(task)});
  const bool holding = holdingSince_.has_value();
  const bool wake = threadWait_ == ThreadWait::Idle || (threadWait_ == ThreadWait::Caller && tasks_.size() > 1);
  lock.unlock();
  if (wake) ready_.notify_all();
  if (holding) watched_.notify_all();
  return id;
}

void CollectiveQueue::repair() {
  std::lock_guard lock(mutex_);
  broken_.clear();
}

bool CollectiveQueue::runIfNext(uint64_t id) {
  std::unique_lock lock(mutex_);
  if (running_ || tasks_.empty() || tasks_.front().id != id) return false;
  Queued queued = std::move(tasks_.front());
  tasks_.pop_front();
  runLocked(lock, std::move(queued));
  return true;
}

void CollectiveQueue::runLocked(std::unique_lock<std::mutex>& lock, Queued queued) {
  running_ = true;
  lock.unlock();
  runParts(queued.task);
  queued.task = {};  // drops the tensors before the next task starts
  lock.lock();
  running_ = false;
  // The queue's thread waits for the queue to be free only with a task queued, or to stop.
  const bool wake = threadWait_ == ThreadWait::Idle && (!tasks_.empty() || stopping_);
  lock.unlock();
  if (wake) ready_.notify_all();
  lock.lock();
}

void CollectiveQueue::runParts(Task& task) {
  CollectiveQueue* const outer = queueRunningHere;
  queueRunningHere = this;
  const char* holder;  // the completion this task runs inside of (nested), or none
  {
    std::lock_guard lock(mutex_);
    holder = holdingSince_ ? holder_ : nullptr;
    holdingSince_.reset();  // a collective is bounded: no hold while it runs
  }
  runPart(task.collective);
  // The watchdog only needs waking when tasks wait behind a completion (a push during one wakes
  // it too): a wake-up per collective would cost a context switch each.
  if (task.complete) {
    bool waiting;
    {
      std::lock_guard lock(mutex_);
      holdingSince_ = Clock::now();
      holder_ = task.call;
      waiting = !tasks_.empty();
    }
    if (waiting) watched_.notify_all();
    runPart(task.complete);
  }
  bool waiting;
  {
    std::lock_guard lock(mutex_);
    if (holder != nullptr) {  // back in the outer completion, which made progress just now
      holdingSince_ = Clock::now();
      holder_ = holder;
    } else {
      holdingSince_.reset();
    }
    waiting = holder != nullptr && !tasks_.empty();
  }
  if (waiting) watched_.notify_all();
  queueRunningHere = outer;
}

void CollectiveQueue::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    threadWait_ = ThreadWait::Idle;
    ready_.wait(lock, [&] { return (stopping_ && !running_) || (!tasks_.empty() && !running_); });
    threadWait_ = ThreadWait::Running;
    if (tasks_.empty()) return;  // stopping, and everything queued ran
    if (leaveToCallerLocked(lock)) continue;
    Queued queued = std::move(tasks_.front());
    tasks_.pop_front();
    runLocked(lock, std::move(queued));
  }
}

bool CollectiveQueue::leaveToCallerLocked(std::unique_lock<std::mutex>& lock) {
  if (stopping_ || tasks_.size() != 1) return false;
  const uint64_t lone = tasks_.front().id;
  const Clock::time_point until = tasks_.front().pushed + callerWindow_;
  if (Clock::now() >= until) {  // its caller left it: this thread runs it
    callerWindow_ = kCallerFirst;
    return false;
  }
  threadWait_ = ThreadWait::Caller;
  ready_.wait_until(lock, until, [&] { return stopping_ || tasks_.size() > 1; });
  threadWait_ = ThreadWait::Running;
  if (tasks_.empty() || tasks_.front().id != lone) callerWindow_ = std::min(2 * callerWindow_, kCallerFirstMax);
  return true;
}

std::deque<CollectiveQueue::Queued> CollectiveQueue::expireLocked(Clock::time_point now) {
  if (!holdingSince_) return {};
  const Clock::time_point since = *holdingSince_;
  const auto late = std::find_if(tasks_.begin(), tasks_.end(), [&](const Queued& q) {
    return q.task.timeout.count() > 0 && now - std::max(q.pushed, since) >= q.task.timeout;
  });
  if (late == tasks_.end()) return {};
  broken_ = std::string("not started: a Future callback of the ") + holder_ +
            " before it has held the group's queue for over " +
            std::to_string(late->task.timeout.count()) +
            " ms (the timeout); the group fails every collective from now on (its ranks may no "
            "longer agree on their order)";
  return std::exchange(tasks_, {});
}

void CollectiveQueue::watch() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    auto expired = expireLocked(Clock::now());
    if (!expired.empty()) {
      const std::string reason = broken_;
      lock.unlock();
      for (auto& q : expired) failTask(q.task, reason);  // their callbacks run here
      expired.clear();
      lock.lock();
      continue;
    }
    std::optional<Clock::time_point> next;
    if (holdingSince_)
      for (const auto& q : tasks_)
        if (q.task.timeout.count() > 0) {
          const auto deadline = std::max(q.pushed, *holdingSince_) + q.task.timeout;
          next = next ? std::min(*next, deadline) : deadline;
        }
    if (next)
      watched_.wait_until(lock, *next);
    else
      watched_.wait(lock);  // until a completion begins, a task comes during one, or stopping
  }
}

}  // namespace drun::torch_backend

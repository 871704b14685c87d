#include "event_queue.hpp"

#include <condition_variable>
#include <deque>
#include <mutex>

namespace drun::agent::detail {

struct EventQueue::State {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::string> lines;
  uint64_t pushed = 0;
  uint64_t done = 0;  // written or dropped
  uint64_t dropped = 0;
  bool closing = false;
  size_t maxQueued = 0;
  Writer writer;

  void run() {
    std::unique_lock lock(mutex);
    for (;;) {
      changed.wait(lock, [this] { return closing || !lines.empty(); });
      if (closing) return;
      std::vector<std::string> batch;
      while (!lines.empty() && batch.size() < kMaxBatch) {
        batch.push_back(std::move(lines.front()));
        lines.pop_front();
      }
      lock.unlock();
      bool ok = true;
      try {
        writer(batch);
      } catch (...) {
        ok = false;  // the writer says why (debug log); the events are lost, not the agent
      }
      lock.lock();
      if (!ok) dropped += batch.size();
      done += batch.size();
      changed.notify_all();
    }
  }
};

EventQueue::EventQueue(Writer writer, size_t maxQueued) : state_(std::make_shared<State>()) {
  state_->writer = std::move(writer);
  state_->maxQueued = maxQueued;
  thread_ = OwnedThread("event queue", [state = state_] { state->run(); });
}

EventQueue::~EventQueue() {
  {
    std::lock_guard lock(state_->mutex);
    state_->closing = true;
    state_->changed.notify_all();
  }
  thread_.join(kStopBound);
}

void EventQueue::push(std::string line) {
  std::lock_guard lock(state_->mutex);
  ++state_->pushed;
  if (state_->lines.size() >= state_->maxQueued) {
    ++state_->dropped;
    ++state_->done;
    return;
  }
  state_->lines.push_back(std::move(line));
  state_->changed.notify_all();
}

bool EventQueue::flush(std::chrono::milliseconds deadline) {
  std::unique_lock lock(state_->mutex);
  const uint64_t target = state_->pushed;
  return state_->changed.wait_for(lock, deadline, [&] { return state_->done >= target; });
}

uint64_t EventQueue::dropped() const {
  std::lock_guard lock(state_->mutex);
  return state_->dropped;
}

}  // namespace drun::agent::detail

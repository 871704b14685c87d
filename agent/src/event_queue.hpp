// EventQueue: one thread that hands the agent's event lines to a writer (a file, the store) in
// order, off the event loop: the loop only queues. Bounded: past maxQueued lines new ones are
// dropped and counted (an event log never holds the job up). flush() waits for what is queued,
// with a deadline.
//
// Threading: push()/flush()/dropped() from any thread; the writer runs on the queue's thread.
// Ownership: the queue owns its thread (an OwnedThread: signals blocked), which shares the
// state: the destructor stops taking lines and joins the thread once its current write is done,
// within kStopBound; a writer still stuck in a store call then (each has its deadline) is left
// to end with it, so it never holds up the agent's exit.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "drun/common/owned_thread.hpp"

namespace drun::agent::detail {

class EventQueue {
 public:
  // Gets every line queued since its last call (at most kMaxBatch), in order: one write for all
  // of them. It may throw: those lines are dropped (counted) and the next ones are tried.
  using Writer = std::function<void(const std::vector<std::string>& lines)>;
  static constexpr size_t kMaxBatch = 256;
  static constexpr std::chrono::milliseconds kStopBound{500};
  explicit EventQueue(Writer writer, size_t maxQueued = 1024);
  ~EventQueue();
  EventQueue(const EventQueue&) = delete;
  EventQueue& operator=(const EventQueue&) = delete;

  void push(std::string line);
  // Waits until every line pushed so far was written (or dropped); false at the deadline.
  bool flush(std::chrono::milliseconds deadline);
  uint64_t dropped() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
  OwnedThread thread_;
};

}  // namespace drun::agent::detail

// CollectiveQueue: runs a ProcessGroupDrun's collectives one at a time in the order they were
// issued (which is the same on every rank, as libdrun_comm requires), so that each call returns
// its Work at once and the caller (DDP's backward pass) computes while the data moves. This is
// ProcessGroupGloo's design with one worker thread, plus two shortcuts:
//
// - A caller that waits for a task nobody has started yet, at the head of the queue, runs it
//   itself (runIfNext), so that a synchronous collective (torch waits at once) costs no thread
//   hand-off (two wake-ups, tens of microseconds on a loaded machine: more than a shared-memory
//   all_reduce). So that the caller finds it there, the queue's thread leaves a task that is
//   alone in the queue to its caller for a window after its push (a task with others behind
//   it starts at once): a thread that took it first made a synchronous collective wait for that
//   thread's run and hand-back, and a context switch among the ranks' threads. A lone task pushed
//   while the thread gives way to an earlier one wakes nobody: the thread looks again at its
//   deadline, so a loop of synchronous collectives wakes it about twice per window (the
//   deadline, then the next push after it went idle), not once per call. Each of those wake-ups
//   takes a core from a rank for a context switch (tens of microseconds on a virtual machine),
//   so the window adapts: it doubles, from kCallerFirst up to kCallerFirstMax, each time the
//   caller took its task, and falls back to kCallerFirst when a lone task reached its deadline
//   unstarted. An asynchronous collective nobody waits for starts at most kCallerFirst late, or
//   kCallerFirstMax right after a run of synchronous ones.
// - A task pushed from inside another task of the same queue (a Future callback that issues a
//   collective: DDP's comm hooks, powerSGD) runs at once, inline, on that thread: behind the
//   running task it could never start, and the callback waiting for it would wait for ever. The
//   order stays the same on every rank: a callback runs right after its collective, before the
//   next queued task, or on the issuing thread before that thread issues anything else.
//
// Each task has two parts: the collective (bounded by its timeout) and its completion (the
// Work's Future: user callbacks, unbounded). When a completion holds the queue longer than a
// queued task's timeout, a watchdog fails every queued task with an error naming its collective
// and the one whose callback holds the queue, and the queue fails every later task at once: its
// ranks no longer agree on the order. So every wait on a task is bounded.
//
// Threading: push() and runIfNext() from any thread; task parts must not throw (they catch).
// The destructor runs what is still queued (each task is bounded by its timeout), then joins the
// two threads.
#pragma once

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace drun::torch_backend {

class CollectiveQueue {
 public:
  using Clock = std::chrono::steady_clock;

  struct Task {
    const char* call = "collective";  // names it in errors
    // How long it may wait in the queue behind a completion; zero or less: no limit.
    std::chrono::milliseconds timeout{0};
    std::function<void()> collective;            // bounded by the timeout
    std::function<void()> complete;              // may be empty; runs user callbacks
    std::function<void(const std::string&)> fail;  // instead of both: never started
  };

  // How long a task alone in the queue is left to its caller's wait() (above): the window's
  // bounds.
  static constexpr std::chrono::microseconds kCallerFirst{50};
  static constexpr std::chrono::microseconds kCallerFirstMax{1000};

  CollectiveQueue();
  ~CollectiveQueue();
  CollectiveQueue(const CollectiveQueue&) = delete;
  CollectiveQueue& operator=(const CollectiveQueue&) = delete;

  // Queues `task` (or runs it inline, or fails it: see above); returns its id for runIfNext.
  uint64_t push(Task task);
  // Runs task `id` on this thread if it is next and nothing runs; false if it started already
  // (or ran), or tasks before it are pending.
  bool runIfNext(uint64_t id);
  // Makes a queue that failed its tasks usable again (in-process recovery's reform: the ranks
  // agree on the order anew).
  void repair();
  // Runs what is queued (each task bounded by its timeout), then joins the two threads; later
  // tasks fail at once. Idempotent. Python's exit calls it (drun.torch's atexit hook): a queue
  // thread that ran a Future's completion during the interpreter's finalization would be ended
  // inside a destructor when it takes the GIL, and the process would abort.
  void stop();

 private:
  struct Queued {
    uint64_t id;
    Clock::time_point pushed;
    Task task;
  };
  // What the queue's thread is waiting for, so push() knows whether to wake it.
  enum class ThreadWait {
    Running,  // not waiting: it runs a task, or looks at the queue (it sees every push)
    Idle,     // a task, or the queue free: a push wakes it
    Caller,   // a lone task's kCallerFirst to pass: a push of a second task wakes it, the
              // push of a lone task does not (the thread looks again at its deadline)
  };
  void loop();
  // With the lock held: waits while the front task, alone in the queue, is younger than the
  // window, and adapts the window; true if it waited (the queue must be looked at again).
  bool leaveToCallerLocked(std::unique_lock<std::mutex>& lock);
  void watch();
  // Runs `task` (the lock released meanwhile), then marks the queue free again.
  void runLocked(std::unique_lock<std::mutex>& lock, Queued queued);
  // Both parts of `task` on this thread (the lock not held), this queue marked as running here.
  void runParts(Task& task);
  // With the lock held: the queued tasks that waited longer than their timeout behind a
  // completion; if any, every queued task is taken out and the queue marked broken.
  std::deque<Queued> expireLocked(Clock::time_point now);

  std::mutex mutex_;
  std::condition_variable ready_;    // the queue's thread: a task, or the queue free
  std::condition_variable watched_;  // the watchdog: a completion began, or stopping
  std::deque<Queued> tasks_;
  uint64_t nextId_ = 0;
  bool running_ = false;  // a task runs (on the queue's thread or a waiter's)
  bool stopping_ = false;
  ThreadWait threadWait_ = ThreadWait::Running;
  std::chrono::microseconds callerWindow_ = kCallerFirst;  // the queue's thread's only
  // While a completion runs: since when (or since the last nested collective ended), and whose.
  std::optional<Clock::time_point> holdingSince_;
  const char* holder_ = nullptr;
  std::string broken_;  // why every task now fails at once; empty while usable
  const pid_t owner_ = ::getpid();  // the process whose threads these are (not a forked child)
  std::thread thread_;    // last two: start once the members above exist
  std::thread watchdog_;
};

}  // namespace drun::torch_backend

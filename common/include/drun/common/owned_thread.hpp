// Background threads with an owner.
//
// spawnThreadWithSignalsBlocked(f): a std::thread that starts with every signal blocked. Signals
// belong to the thread that waits for them (the agent's event loop, a test's main thread): a
// helper thread must neither take one (a handler would run there, or the default action would
// kill the process for a signal the loop handles) nor see its blocking call fail with EINTR.
//
// OwnedThread: such a thread, owned by one object that stops it (the owner's business: a flag,
// a closed queue, an interrupted connection) and then calls join(bound). join() waits at most
// `bound` for the body to return. A body still inside a blocking call after the bound (a
// write(2) to a reader that stopped reading, getaddrinfo with a dead resolver, a store call past
// its deadline) is not waited for: join() says so in a debug log line naming the thread, detaches
// it and returns false, so that no owner hangs on it. Such a body must share (shared_ptr)
// everything it touches after its blocking call returns, never borrow from its owner; it ends
// with its call or with the process. The destructor joins with kDefaultJoinBound when the owner
// did not join.
//
// No exception leaves a body: one that escapes is logged (debug) and the thread ends.
//
// Threading: construct, join() and destroy from one thread (the owner's), never from the body.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace drun {

// Starts `body` on a new thread whose signal mask blocks every signal; the caller's mask is
// unchanged. Throws std::system_error when no thread can be created.
std::thread spawnThreadWithSignalsBlocked(std::function<void()> body);

class OwnedThread {
 public:
  static constexpr std::chrono::milliseconds kDefaultJoinBound{1000};

  OwnedThread() = default;
  // `name` says which thread a log line is about ("console writer", "resolver lookup").
  OwnedThread(std::string name, std::function<void()> body);
  ~OwnedThread();
  OwnedThread(OwnedThread&&) noexcept = default;
  OwnedThread& operator=(OwnedThread&& other) noexcept;
  OwnedThread(const OwnedThread&) = delete;
  OwnedThread& operator=(const OwnedThread&) = delete;

  // Waits up to `bound` for the body to return and joins the thread: true. Past the bound the
  // thread is left running (detached, logged): false. True at once when there is no thread.
  bool join(std::chrono::milliseconds bound);
  bool joinable() const { return thread_.joinable(); }
  // The body has returned (the thread may still be ending).
  bool finished() const;
  const std::string& name() const { return name_; }

 private:
  struct Done;
  std::string name_;
  std::shared_ptr<Done> done_;
  std::thread thread_;
};

}  // namespace drun

// Point-to-point requests over Gloo's unbound buffers, and GlooPoller: the one thread per
// backend that completes the requests someone polled with test().
//
// Gloo can only block on an unbound buffer (a wait that times out breaks the whole context), so
// a request that is only ever waited for blocks in Gloo on the caller's thread; one that was
// tested goes to the backend's poller, which blocks on one buffer at a time and rotates when a
// caller tests or waits on another (Gloo's abortWait interrupts the current wait, which is then
// taken up again later). A dropped request stays with the poller until it completes or its
// deadline passes: dropping never blocks. No thread per request.
// Threading: thread-safe. Ownership: requests and the backend share the poller; the backend
// stops it (fails what is pending) before its context goes.
#pragma once

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend.hpp"
#include "drun/common/deadline.hpp"

namespace drun::comm::detail {

// Gloo's errors as drun's (defined in gloo_backend.cpp); call from a catch block.
[[noreturn]] void rethrowGlooAsDrun();

class GlooPoller;

class GlooP2P final : public Request::State, public std::enable_shared_from_this<GlooP2P> {
 public:
  // Gloo refuses empty buffers: a zero-byte message travels as one byte of `empty_`.
  // what: the operation, for its errors ("recv from rank 2 (tag 5)").
  GlooP2P(gloo::Context& context, void* ptr, size_t bytes, bool isSend, milliseconds timeout,
          std::shared_ptr<GlooPoller> poller, std::string what = "");
  gloo::transport::UnboundBuffer& buffer() { return *buf_; }

  // Called once when it finishes (on the finishing thread, under no lock of this request's: it
  // may take only a leaf lock); what it captures lives as long as this request (a buffer Gloo
  // writes into, for one).
  void onFinish(std::function<void()> callback);

  // This request's error once its communicator was aborted (GlooPoller::abort).
  std::exception_ptr abortedError() const;

  void wait(milliseconds timeout) override;
  bool test() override;
  int source() const override { return source_; }

 private:
  friend class GlooPoller;
  enum class State { Idle, Direct, Polled, Done };
  // Blocks in Gloo until done (true) or interrupted by abortWait (false); throws drun's errors.
  bool waitOnce(milliseconds limit);
  void interrupt();
  void finish(std::exception_ptr error);

  std::mutex mutex_;
  std::condition_variable cv_;
  char empty_ = 0;
  std::unique_ptr<gloo::transport::UnboundBuffer> buf_;
  bool isSend_;
  std::string what_;
  milliseconds timeout_;
  Deadline deadline_;
  std::shared_ptr<GlooPoller> poller_;
  State state_ = State::Idle;
  std::exception_ptr error_;
  std::atomic<int> source_{-1};
  std::function<void()> onFinish_;  // under mutex_
};

class GlooPoller {
 public:
  ~GlooPoller() { stop(); }
  void add(std::shared_ptr<GlooP2P> request);
  void want(GlooP2P* request);  // serve it next
  // Fails every pending request and joins the thread.
  void stop();
  // The communicator failed (Backend::abort): every request fails at once, whether polled,
  // blocked in Gloo on a caller's thread, never waited for, or posted later. Nothing could
  // complete them any more, and each would otherwise wait for its deadline.
  void abort();
  // A caller's thread blocking in Gloo on `request` (a request never polled) registers for the
  // time it blocks, so that abort() can interrupt it; false once aborted (then it must not block).
  bool enterDirect(GlooP2P* request);
  void leaveDirect(GlooP2P* request);
  bool aborted();

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<GlooP2P>> pending_;
  std::vector<GlooP2P*> direct_;  // blocked in Gloo on callers' threads
  GlooP2P* current_ = nullptr;
  bool stopping_ = false;
  bool aborted_ = false;
  std::thread thread_;
};

}  // namespace drun::comm::detail

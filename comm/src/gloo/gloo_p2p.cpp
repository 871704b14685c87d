#include "gloo/gloo_p2p.hpp"

#include <algorithm>
#include "drun/common/owned_thread.hpp"

namespace drun::comm::detail {

GlooP2P::GlooP2P(gloo::Context& context, void* ptr, size_t bytes, bool isSend, milliseconds timeout,
                 std::shared_ptr<GlooPoller> poller, std::string what)
    : buf_(context.createUnboundBuffer(bytes ? ptr : &empty_, bytes ? bytes : 1)),
      isSend_(isSend), what_(std::move(what)), timeout_(timeout), deadline_(timeout), poller_(std::move(poller)) {}

bool GlooP2P::waitOnce(milliseconds limit) {
  int peer = -1;
  bool completed = false;
  try {
    // Gloo reads 0 as "the context's timeout": at least 1 ms.
    completed = isSend_ ? buf_->waitSend(&peer, std::max(limit, milliseconds(1)))
                        : buf_->waitRecv(&peer, std::max(limit, milliseconds(1)));
  } catch (...) {
    try {
      rethrowGlooAsDrun();
    } catch (const TimeoutError& e) {  // Gloo's own words name no rank: the operation does
      if (what_.empty()) throw;
      throw TimeoutError("gloo " + what_ + " timed out after " + std::to_string(timeout_.count()) + "ms (" + e.what() + ")");
    } catch (const CommError& e) {
      if (what_.empty()) throw;
      throw CommError("gloo " + what_ + ": " + e.what());
    }
  }
  if (completed && !isSend_) source_ = peer;
  return completed;
}

std::exception_ptr GlooP2P::abortedError() const {
  return std::make_exception_ptr(CommError("gloo " + (what_.empty() ? std::string("request") : what_) + ": " +
                                           kAbortedAfterFailure));
}

void GlooP2P::interrupt() {
  if (isSend_) buf_->abortWaitSend();
  else buf_->abortWaitRecv();
}

void GlooP2P::finish(std::exception_ptr error) {
  std::function<void()> callback;
  {
    std::lock_guard lock(mutex_);
    state_ = State::Done;
    error_ = error;
    callback = onFinish_;
    cv_.notify_all();
  }
  if (callback) callback();
}

void GlooP2P::onFinish(std::function<void()> callback) {
  std::lock_guard lock(mutex_);
  onFinish_ = std::move(callback);
}

void GlooP2P::wait(milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (state_ == State::Idle) {  // never polled: block in Gloo right here
    state_ = State::Direct;
    lock.unlock();
    milliseconds left = deadline_.remaining();
    if (timeout != kDefaultTimeout) left = std::min(left, timeout);
    std::exception_ptr error;
    if (!poller_->enterDirect(this)) {
      error = abortedError();
    } else {
      try {
        if (!waitOnce(left)) error = abortedError();  // only abort() interrupts a direct wait
      } catch (...) {
        error = std::current_exception();
      }
      poller_->leaveDirect(this);
    }
    finish(error);
    if (error) std::rethrow_exception(error);
    return;
  }
  if (state_ == State::Polled) {
    lock.unlock();
    poller_->want(this);
    lock.lock();
  }
  // The poller (or a direct waiter) finishes it by the deadline; the slack covers a rotation.
  const auto until = timeout == kDefaultTimeout ? deadline_.when() + std::chrono::seconds(1)
                                                : Clock::now() + timeout;
  if (!cv_.wait_until(lock, until, [&] { return state_ == State::Done; }))
    throw TimeoutError("wait timed out after " +
                       std::to_string((timeout == kDefaultTimeout ? timeout_ : timeout).count()) + "ms");
  if (error_) std::rethrow_exception(error_);
}

bool GlooP2P::test() {
  std::unique_lock lock(mutex_);
  switch (state_) {
    case State::Done:
      if (error_) std::rethrow_exception(error_);
      return true;
    case State::Direct:
      return false;  // another thread blocks on it
    case State::Idle:
      state_ = State::Polled;
      lock.unlock();
      poller_->add(shared_from_this());
      return false;
    case State::Polled:
      lock.unlock();
      poller_->want(this);
      return false;
  }
  return false;
}

void GlooPoller::add(std::shared_ptr<GlooP2P> request) {
  std::lock_guard lock(mutex_);
  if (aborted_) {
    request->finish(request->abortedError());
    return;
  }
  if (stopping_) {
    request->finish(std::make_exception_ptr(CommError("gloo: the communicator was destroyed")));
    return;
  }
  pending_.push_front(std::move(request));  // the caller polls it now: serve it first
  if (current_) current_->interrupt();
  if (!thread_.joinable()) thread_ = spawnThreadWithSignalsBlocked([this] { loop(); });
  cv_.notify_all();
}

void GlooPoller::want(GlooP2P* request) {
  std::lock_guard lock(mutex_);
  if (current_ == request) return;
  auto at = std::find_if(pending_.begin(), pending_.end(), [&](const auto& p) { return p.get() == request; });
  if (at == pending_.end()) return;  // finished meanwhile
  auto keep = *at;
  pending_.erase(at);
  pending_.push_front(std::move(keep));
  if (current_) current_->interrupt();
}

void GlooPoller::stop() {
  std::thread thread;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    if (current_) current_->interrupt();
    cv_.notify_all();
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
  std::lock_guard lock(mutex_);
  for (auto& p : pending_) p->finish(std::make_exception_ptr(CommError("gloo: the communicator was destroyed")));
  pending_.clear();
}

void GlooPoller::abort() {
  std::lock_guard lock(mutex_);
  if (aborted_) return;
  aborted_ = true;
  if (current_) current_->interrupt();  // the loop fails it when its wait returns
  for (GlooP2P* request : direct_) request->interrupt();
  for (auto& p : pending_) p->finish(p->abortedError());
  pending_.clear();
}

bool GlooPoller::enterDirect(GlooP2P* request) {
  std::lock_guard lock(mutex_);
  if (aborted_) return false;
  direct_.push_back(request);
  return true;
}

void GlooPoller::leaveDirect(GlooP2P* request) {
  std::lock_guard lock(mutex_);
  direct_.erase(std::remove(direct_.begin(), direct_.end(), request), direct_.end());
}

bool GlooPoller::aborted() {
  std::lock_guard lock(mutex_);
  return aborted_;
}

void GlooPoller::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    if (stopping_) return;
    auto request = pending_.front();
    pending_.pop_front();
    current_ = request.get();
    lock.unlock();
    bool finished = false;
    std::exception_ptr error;
    try {
      finished = request->waitOnce(request->deadline_.remaining());
    } catch (...) {
      error = std::current_exception();
      finished = true;
    }
    if (finished) request->finish(error);
    lock.lock();
    current_ = nullptr;
    if (finished) continue;
    if (aborted_) request->finish(request->abortedError());
    else pending_.push_back(std::move(request));  // interrupted: its turn comes again
  }
}

}  // namespace drun::comm::detail

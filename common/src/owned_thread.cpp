#include "drun/common/owned_thread.hpp"

#include <pthread.h>
#include <signal.h>

#include <condition_variable>
#include <mutex>
#include <spdlog/spdlog.h>

#include "drun/common/log.hpp"

namespace drun {

std::thread spawnThreadWithSignalsBlocked(std::function<void()> body) {
  // A new thread inherits its creator's mask: block everything around the creation.
  sigset_t all, previous;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  try {
    std::thread thread(std::move(body));
    ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    return thread;
  } catch (...) {
    ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    throw;
  }
}

struct OwnedThread::Done {
  std::mutex mutex;
  std::condition_variable changed;
  bool finished = false;
};

OwnedThread::OwnedThread(std::string name, std::function<void()> body)
    : name_(std::move(name)), done_(std::make_shared<Done>()) {
  // The registry outlives the statics that own threads (log.hpp), and a body may log.
  log::ensureRegistry();
  thread_ = spawnThreadWithSignalsBlocked([done = done_, name = name_, body = std::move(body)]() mutable {
    try {
      auto run = std::move(body);  // what the body holds is released before it counts as finished
      run();
    } catch (const std::exception& e) {
      spdlog::debug("{} thread: {}", name, e.what());
    } catch (...) {
      spdlog::debug("{} thread: an unknown exception", name);
    }
    std::lock_guard lock(done->mutex);
    done->finished = true;
    done->changed.notify_all();
  });
}

OwnedThread::~OwnedThread() { join(kDefaultJoinBound); }

OwnedThread& OwnedThread::operator=(OwnedThread&& other) noexcept {
  if (this != &other) {
    join(kDefaultJoinBound);
    name_ = std::move(other.name_);
    done_ = std::move(other.done_);
    thread_ = std::move(other.thread_);
  }
  return *this;
}

bool OwnedThread::finished() const {
  if (!done_) return true;
  std::lock_guard lock(done_->mutex);
  return done_->finished;
}

bool OwnedThread::join(std::chrono::milliseconds bound) {
  if (!thread_.joinable()) return true;
  bool ended;
  {
    std::unique_lock lock(done_->mutex);
    ended = done_->changed.wait_for(lock, bound, [&] { return done_->finished; });
  }
  if (ended) {
    thread_.join();  // the body has returned: the thread is about to end
    return true;
  }
  spdlog::debug("{} thread still in a blocking call after {} ms: left to end with that call or "
                "with the process", name_, bound.count());
  thread_.detach();
  return false;
}

}  // namespace drun

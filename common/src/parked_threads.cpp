#include "drun/common/parked_threads.hpp"

#include <algorithm>
#include <mutex>
#include <vector>

#include "drun/common/log.hpp"

namespace drun {
namespace {

class ParkedThreads {
 public:
  static ParkedThreads& instance() {
    log::ensureRegistry();  // built first, destroyed after: the threads' last lines have a logger
    static ParkedThreads parked;
    return parked;
  }

  void park(OwnedThread thread) {
    std::vector<OwnedThread> ended;
    {
      std::lock_guard lock(mutex_);
      auto done = std::partition(threads_.begin(), threads_.end(),
                                 [](const OwnedThread& t) { return !t.finished(); });
      std::move(done, threads_.end(), std::back_inserter(ended));
      threads_.erase(done, threads_.end());
      threads_.push_back(std::move(thread));
    }
    for (OwnedThread& t : ended) t.join(OwnedThread::kDefaultJoinBound);  // ended: at once
  }

  ~ParkedThreads() {
    std::vector<OwnedThread> threads;
    {
      std::lock_guard lock(mutex_);
      threads.swap(threads_);
    }
    const auto deadline = std::chrono::steady_clock::now() + kParkedThreadsExitBound;
    for (OwnedThread& t : threads) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      t.join(std::max(left, std::chrono::milliseconds(0)));
    }
  }

 private:
  std::mutex mutex_;
  std::vector<OwnedThread> threads_;
};

}  // namespace

void parkUntilExit(OwnedThread thread) { ParkedThreads::instance().park(std::move(thread)); }

}  // namespace drun

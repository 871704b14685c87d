#include "state_keeper.hpp"

#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <functional>
#include <spdlog/spdlog.h>
#include <system_error>

#include "drun/common/error.hpp"
#include "drun/common/owned_thread.hpp"
#include "drun/rendezvous/keys.hpp"
#include "history_file.hpp"
#include "state_file.hpp"

namespace drun::rdzv::state {

// Calls `tick` on the io thread one period after schedule(), once however often it was scheduled
// meanwhile; an exception from it is logged. Armed only while a change waits, so that an idle
// keeper holds no work on the io (the server's io ends when its work does).
class StateKeeper::Timer {
 public:
  Timer(boost::asio::io_context& io, std::chrono::milliseconds period, std::function<void()> tick)
      : timer_(io), period_(period), tick_(std::move(tick)) {}

  void schedule() {
    if (armed_ || stopped_) return;
    armed_ = true;
    timer_.expires_after(period_);
    timer_.async_wait([this](const boost::system::error_code& error) {
      if (error) return;  // cancelled: the keeper is stopping or gone
      armed_ = false;
      try {
        tick_();
      } catch (const std::exception& e) {
        spdlog::error("--state-dir: keeping the jobs' history failed: {}", e.what());
      }
    });
  }
  void stop() {
    stopped_ = true;
    timer_.cancel();
  }

 private:
  boost::asio::steady_timer timer_;
  std::chrono::milliseconds period_;
  std::function<void()> tick_;
  bool armed_ = false;
  bool stopped_ = false;
};

StateKeeper::StateKeeper(StoreServer& server, StateKeeperOptions options)
    : options_(std::move(options)), file_(options_.dir / kStateFileName) {
  std::error_code error;
  std::filesystem::create_directories(options_.dir, error);
  if (error)
    throw InvalidArgument("--state-dir " + options_.dir.string() + ": cannot create it: " + error.message());
  if (!std::filesystem::is_directory(options_.dir) || ::access(options_.dir.c_str(), W_OK | X_OK) != 0)
    throw InvalidArgument("--state-dir " + options_.dir.string() + ": not a writable directory");
  server.attach([this](boost::asio::io_context& io, StoreCore& core) {
    io_ = &io;
    core_ = &core;
    restore(core);
    timer_ = std::make_unique<Timer>(io, options_.flushPeriod, [this] { flush(); });
    core.observeWrites([this](const std::string& key, const Bytes*) {
      if (!isHistoryKey(key)) return;
      stale_ = true;
      timer_->schedule();
    });
  });
  writer_ = spawnThreadWithSignalsBlocked([this] { writerLoop(); });  // signals are the loop's
}

StateKeeper::~StateKeeper() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (writer_.joinable()) writer_.join();
}

void StateKeeper::stop() {
  boost::asio::post(*io_, [timer = timer_.get()] { timer->stop(); });
}

void StateKeeper::finish() {
  if (!writer_.joinable()) return;
  flush();
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  writer_.join();
}

// The one write to the store outside a session (StoreServer::attach): before the server serves.
void StateKeeper::restore(StoreCore& core) {
  std::vector<JobHistoryKeys> jobs;
  try {
    std::optional<std::string> text = readStateFile(file_, options_.maxBytes);
    if (!text) {
      spdlog::info("--state-dir: no {} yet: no history to restore", file_.string());
      return;
    }
    jobs = parseHistory(*text);
  } catch (const Error& e) {
    std::string aside;
    try {
      aside = "moved aside to " + moveAside(file_).string();
    } catch (const Error& moveError) {
      aside = "not moved aside: " + std::string(moveError.what());
    }
    spdlog::warn("--state-dir: {} cannot be used ({}): {}; starting with no history", file_.string(),
                 e.what(), aside);
    return;
  }
  for (const JobHistoryKeys& job : jobs) {
    try {
      for (const auto& [key, value] : job.entries) core.set(key, value);
      ++jobsRestored_;
    } catch (const Error& e) {  // over a budget of this daemon (--max-stored-bytes...)
      core.erasePrefix(keys::job(job.runId));
      spdlog::warn("--state-dir: job {}'s history not restored: {}", job.runId, e.what());
    }
  }
  spdlog::info("--state-dir: restored the history of {} jobs from {}", jobsRestored_, file_.string());
}

void StateKeeper::flush() {
  if (!stale_ || !core_) return;
  stale_ = false;
  HistorySnapshot snapshot = snapshotHistory(*core_, options_.maxBytes);
  if (snapshot.leftOut != leftOut_ && !snapshot.leftOut.empty())
    spdlog::warn("--state-dir: {} jobs' history left out of {} (over its {} bytes), e.g. job {}",
                 snapshot.leftOut.size(), file_.string(), options_.maxBytes, snapshot.leftOut.front());
  leftOut_ = std::move(snapshot.leftOut);
  {
    std::lock_guard lock(mutex_);
    pending_ = std::move(snapshot.text);
  }
  wake_.notify_all();
}

void StateKeeper::writerLoop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return pending_.has_value() || stopping_; });
    if (!pending_) return;
    std::string text = std::move(*pending_);
    pending_.reset();
    lock.unlock();
    try {
      writeStateFile(file_, text);
    } catch (const std::exception& e) {
      spdlog::warn("--state-dir: cannot write the jobs' history: {}", e.what());
    }
    lock.lock();
  }
}

}  // namespace drun::rdzv::state

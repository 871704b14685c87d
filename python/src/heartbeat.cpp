#include "heartbeat.hpp"

#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace drun::torch_backend {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

std::string key(int rank) { return "drun_heartbeat/" + std::to_string(rank); }

milliseconds envMs(const char* name, milliseconds fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  long long value = std::strtoll(text, &end, 10);
  if (*end != '\0' || value < 0)
    throw std::invalid_argument(std::string(name) + ": expected milliseconds >= 0, got '" + text +
                                "'");
  return milliseconds(value);
}

}  // namespace

HeartbeatOptions HeartbeatOptions::fromEnv() {
  HeartbeatOptions o;
  o.period = envMs("DRUN_TORCH_HEARTBEAT_MS", o.period);
  o.staleAfter = envMs("DRUN_TORCH_HEARTBEAT_STALE_MS", std::max(o.staleAfter, 3 * o.period));
  return o;
}

std::string hostLabel() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string label = host;
  if (const char* node = std::getenv("GROUP_RANK"); node != nullptr && *node != '\0')
    label += std::string(" node ") + node;
  return label;
}

class Heartbeat::State {
 public:
  State(c10::intrusive_ptr<c10d::Store> store, int rank, int size, HeartbeatOptions options)
      : store_(std::move(store)), rank_(rank), options_(options), peers_(size) {
    for (auto& p : peers_) p.lastChange = Clock::now();
  }

  void loop() {
    const std::string label = hostLabel();
    for (uint64_t beat = 0;; ++beat) {
      try {
        std::string value = std::to_string(beat) + " " + label;
        store_->set(key(rank_), std::vector<uint8_t>(value.begin(), value.end()));
        observe();
      } catch (...) {  // the store is gone or slow: the peers' keys just stop changing
      }
      std::unique_lock lock(mutex_);
      if (wake_.wait_for(lock, options_.period, [&] { return stopping_; })) break;
    }
    std::lock_guard lock(mutex_);
    exited_ = true;
    wake_.notify_all();
  }

  // Reads every peer's key (each read bounded by storeDeadline) and notes which changed.
  void observe() {
    for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
      if (r == rank_ || !store_->check({key(r)})) continue;
      store_->wait({key(r)}, options_.storeDeadline);
      auto bytes = store_->get(key(r));
      std::string value(bytes.begin(), bytes.end());
      std::lock_guard lock(mutex_);
      Peer& p = peers_[r];
      if (value != p.value) {
        p.value = value;
        p.lastChange = Clock::now();
        auto space = value.find(' ');
        p.host = space == std::string::npos ? "?" : value.substr(space + 1);
      }
    }
  }

  std::string stale() {
    std::lock_guard lock(mutex_);
    std::string named;
    const auto now = Clock::now();
    for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
      if (r == rank_) continue;
      const Peer& p = peers_[r];
      auto silent = std::chrono::duration_cast<milliseconds>(now - p.lastChange);
      if (silent < options_.staleAfter) continue;
      if (!named.empty()) named += "; ";
      named += "rank " + std::to_string(r) + " (host " + (p.host.empty() ? "?" : p.host) +
               ") has not been heard for " + std::to_string((silent.count() + 500) / 1000) + " s";
    }
    return named;
  }

  std::string explainFailure(bool waitForStale) {
    const auto deadline =
        Clock::now() + (waitForStale ? options_.staleAfter + 2 * options_.period : milliseconds(0));
    for (;;) {
      std::string named = stale();
      std::unique_lock lock(mutex_);
      if (!named.empty() || exited_ || Clock::now() >= deadline) return named;
      wake_.wait_for(lock, options_.period / 4);
    }
  }

  // Stops the thread; true once it ended (within storeDeadline + period).
  bool stop() {
    std::unique_lock lock(mutex_);
    stopping_ = true;
    wake_.notify_all();
    return wake_.wait_for(lock, options_.storeDeadline + options_.period, [&] { return exited_; });
  }

 private:
  struct Peer {
    std::string value;
    std::string host;
    Clock::time_point lastChange;
  };

  const c10::intrusive_ptr<c10d::Store> store_;
  const int rank_;
  const HeartbeatOptions options_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool exited_ = false;
  std::vector<Peer> peers_;
};

Heartbeat::Heartbeat(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                     HeartbeatOptions options)
    : state_(std::make_shared<State>(std::move(store), rank, size, options)) {
  thread_ = OwnedThread("heartbeat", [state = state_] { state->loop(); });
}

Heartbeat::~Heartbeat() {
  // The thread shares the state: one stuck in a store call past stop()'s wait is left to end on
  // its own (join's bound is then only the time it takes to end after its loop returned).
  const bool ended = state_->stop();
  thread_.join(ended ? OwnedThread::kDefaultJoinBound : std::chrono::milliseconds(0));
}

std::string Heartbeat::explainFailure(bool waitForStale) {
  return state_->explainFailure(waitForStale);
}

}  // namespace drun::torch_backend

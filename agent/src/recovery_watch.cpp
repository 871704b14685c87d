#include "recovery_watch.hpp"

#include <condition_variable>
#include <mutex>
#include <optional>

#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"
#include "drun/rendezvous/recovery_keys.hpp"

namespace drun::agent::detail {

namespace keys = rdzv::recovery;

// The most generations read after one look of the watch.
constexpr uint64_t kMostBehind = 1024;

struct RecoveryWatch::Shared {
  std::string prefix;
  Handlers handlers;
  std::chrono::milliseconds slice;
  uint64_t after = 0;  // the generations known already: reported from after + 1 on
  std::mutex mutex;
  std::condition_variable changed;
  bool stopping = false;
  uint64_t newest = 0;  // the newest generation begun: the one whose outcome is watched
  std::vector<rdzv::LivenessStore*> connections;  // to interrupt at stop()

  // Runs `f` (a callback) unless stop() was called: under the mutex, so none runs after it.
  template <typename F>
  void report(F&& f) {
    std::lock_guard lock(mutex);
    if (!stopping) f();
  }

  // A connection of the thread's own, registered for stop(); null when stopping.
  std::unique_ptr<rdzv::LivenessStore> connect() {
    auto store = handlers.connect();
    std::lock_guard lock(mutex);
    if (stopping) return nullptr;
    connections.push_back(store.get());
    return store;
  }
  // Takes a connection off the list before it is closed (declared after it: destroyed first).
  struct Registration {
    Shared* shared;
    rdzv::LivenessStore* store;
    ~Registration() {
      std::lock_guard lock(shared->mutex);
      std::erase(shared->connections, store);
    }
  };
  bool stopped() {
    std::lock_guard lock(mutex);
    return stopping;
  }

  void watchGenerations() {
    auto store = connect();
    if (!store) return;
    Registration registered{this, store.get()};
    const std::string key = keys::generation(prefix);
    std::optional<std::string> known;
    uint64_t reported = after;  // the last generation reported
    while (!stopped()) {
      try {
        known = store->watch(key, known, slice);
      } catch (const TimeoutError&) {
        continue;
      }
      const uint64_t g = keys::parseGeneration(known);
      // Every generation since the last one reported, in order: each may renumber the world. A
      // generation's keys are written before `generation` moves to it, so each is there to read.
      // A jump past any real job's count (a corrupt value) is bounded: only its last ones.
      if (g > reported + kMostBehind) {
        spdlog::warn("agent: recovery/generation jumped from {} to {}; reading the last {} only", reported, g,
                     kMostBehind);
        reported = g - kMostBehind;
      }
      for (uint64_t next = reported + 1; next <= g && !stopped(); ++next) {
        Generation generation = readGeneration(*store, prefix, next);
        report([&] { handlers.began(generation); });
        reported = next;
        std::lock_guard lock(mutex);
        newest = std::max(newest, next);
        changed.notify_all();
      }
    }
  }

  void watchOutcomes() {
    auto store = connect();
    if (!store) return;
    Registration registered{this, store.get()};
    uint64_t reported = 0;  // the generation whose outcome was reported last
    for (;;) {
      uint64_t g = 0;
      {
        std::unique_lock lock(mutex);
        changed.wait(lock, [&] { return stopping || newest > reported; });
        if (stopping) break;
        g = newest;
      }
      std::optional<std::string> outcome;
      try {
        outcome = store->watch(keys::outcome(prefix, g), std::nullopt, slice);
      } catch (const TimeoutError&) {
        continue;  // still open, or superseded: look again at the newest
      }
      if (!outcome) continue;
      report([&] { handlers.decided(g, *outcome); });
      reported = g;
    }
  }

  // A thread's body: a store error ends the watch (said once, unless stopping).
  void guard(void (Shared::*body)()) {
    try {
      (this->*body)();
    } catch (const std::exception& e) {
      const std::string what = e.what();
      report([&] { handlers.failed(what); });
    }
  }
};

RecoveryWatch::RecoveryWatch(std::string prefix, Handlers handlers, std::chrono::milliseconds slice, uint64_t after)
    : shared_(std::make_shared<Shared>()) {
  shared_->prefix = std::move(prefix);
  shared_->after = after;
  shared_->handlers = std::move(handlers);
  shared_->slice = slice;
  generations_ = OwnedThread("recovery generations", [s = shared_] { s->guard(&Shared::watchGenerations); });
  outcomes_ = OwnedThread("recovery outcomes", [s = shared_] { s->guard(&Shared::watchOutcomes); });
}

RecoveryWatch::~RecoveryWatch() {
  stop();
  generations_.join(OwnedThread::kDefaultJoinBound);
  outcomes_.join(OwnedThread::kDefaultJoinBound);
}

void RecoveryWatch::stop() {
  std::lock_guard lock(shared_->mutex);
  shared_->stopping = true;
  shared_->changed.notify_all();
  for (rdzv::LivenessStore* store : shared_->connections) store->interrupt();
}

}  // namespace drun::agent::detail

// The generations of in-process recovery (docs/recovery.md) in the front end: forming the newest
// generation (init and reform), what a generation that began does to a communicator of an older
// one (broken, pending operations aborted, its groups too), and reform(): the world moves to the
// newest generation in place, same ranks, new transports.
#include <spdlog/spdlog.h>

#include "communicator_impl.hpp"
#include "op_progress.hpp"

namespace drun::comm {

namespace detail {

FormedGeneration formNewest(Recovery& recovery, uint64_t base, uint64_t atLeast, const GenerationConnector& connect,
                            Recovery::Place place, milliseconds timeout) {
  const Deadline deadline(timeout);
  auto left = [&] { return std::max(deadline.remaining(), milliseconds(1)); };
  uint64_t g = std::max(atLeast, recovery.newest());
  for (;;) {
    const auto started = std::chrono::steady_clock::now();
    FormedGeneration f;
    f.generation = g;
    f.place = recovery.placeIn(base, g, place);  // CommError when a shrink dropped this rank
    try {
      recovery.resize(f.place);
      recovery.joined(g);
      f.store = recovery.generationStore(g);
      f.liveness = std::make_shared<Liveness>(f.store, f.place.rank, f.place.size);
      f.liveness->arm();  // replaces the will of the generation before
      f.backend = connect(recovery.formingStore(g, left()), f.place.rank, f.place.size, left());
      recovery.endForming();
      recovery.formed(g);
      spdlog::debug("drun_comm: rank {} of {} formed generation {} in {} ms", f.place.rank, f.place.size, g,
                    std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - started).count());
      return f;
    } catch (const std::exception& e) {
      recovery.endForming();
      const uint64_t newest = recovery.newest();
      if (newest <= g || deadline.expired()) throw;
      spdlog::debug("drun_comm: rank {}: generation {} was superseded by {} while forming ({}); forming {}",
                    place.rank, g, newest, e.what(), newest);
      g = newest;
    }
  }
}

}  // namespace detail

bool Communicator::Impl::isBroken() const {
  std::lock_guard lock(mutex_);
  return broken_.has_value();
}

detail::Recovery* Communicator::Impl::recovery() const {
  return s_.world ? s_.world->s_.recovery.get() : s_.recovery.get();
}

std::pair<uint64_t, std::string> Communicator::Impl::newerGeneration() {
  detail::Recovery* r = recovery();
  if (!r) return {0, {}};
  try {
    return r->newerThan(generation());
  } catch (const std::exception& e) {
    spdlog::debug("drun_comm: the workers' store's generation could not be read: {}", e.what());
    return {0, {}};
  }
}

void Communicator::Impl::followRecovery() {
  // The listener borrows this: destroy() stops the watcher first, and no call runs after that.
  s_.recovery->follow(generation(), [this](uint64_t newest, const std::string& why, bool grow) {
    generationBegan(newest, why, grow);
  });
}

void Communicator::Impl::generationBegan(uint64_t newest, const std::string& why, bool grow) {
  std::shared_ptr<detail::Backend> backend;
  std::vector<std::shared_ptr<Impl>> groups;
  {
    std::lock_guard lock(mutex_);
    if (destroyed_ || newest <= generation()) return;
    // A grow loses nobody: the old generation's operations go on, and the program moves to the
    // larger world with reform() when it chooses (drun.torch: at its next commit).
    if (grow) {
      spdlog::debug("drun_comm: rank {} of {}: {} (a grow: nothing aborted)", s_.rank, s_.name, why);
      return;
    }
    if (!broken_) broken_ = Broken{Broken::Kind::Generation, why};
    backend = s_.backend;
    for (auto& w : groups_)
      if (auto g = w.lock()) groups.push_back(std::move(g));
  }
  spdlog::debug("drun_comm: rank {} of {}: {}", s_.rank, s_.name, why);
  if (backend) backend->abort();  // pending operations fail now, not at their deadlines
  for (auto& g : groups) g->generationBegan(newest, why, false);
}

void Communicator::Impl::reform(milliseconds timeout) {
  if (s_.world)
    throw InvalidArgument("reform: " + s_.name + " is a group: reform() the world communicator, then make the group "
                          "again with newGroup()");
  if (!s_.recovery)
    throw InvalidArgument("reform: this communicator has no workers' store: in-process recovery needs a program "
                          "started by drun with --recovery in-process (DRUN_WORKER_STORE set) and init from env://");
  timeout = resolve(timeout);
  const Deadline deadline(timeout);
  const uint64_t from = generation();
  auto [newest, why] = s_.recovery->newerThan(from);
  if (newest == 0) {
    // A broken communicator usually saw the failure before the agent opened the generation for
    // it (a dead peer's sockets close at once): wait for the generation, within the deadline.
    if (!isBroken())
      throw InvalidArgument("reform: no recovery in progress (generation " + std::to_string(from) +
                            " is the newest)");
    std::tie(newest, why) = s_.recovery->waitNewerThan(from, deadline.remaining());
    if (newest == 0)
      throw TimeoutError("reform: no generation past " + std::to_string(from) + " began within " +
                         std::to_string(timeout.count()) + "ms (drun's agent opens one when a worker is lost)");
  }
  // When the watcher has not yet: pending operations fail now (a grow's go on to their end).
  generationBegan(newest, why, s_.recovery->growsOnly(from, newest));
  std::unique_lock lock(mutex_);
  if (destroyed_) throw InvalidArgument("reform: the communicator was destroyed");
  if (reforming_) throw InvalidArgument("reform: another reform() of this communicator is in progress");
  if (!cv_.wait_until(lock, deadline.when(), [&] { return !running_ && queue_.empty(); }))
    throw TimeoutError("reform: an operation of generation " + std::to_string(from) + " did not end within " +
                       std::to_string(timeout.count()) + "ms");
  reforming_ = true;
  // Nothing runs on this generation's transports any more: close them (segments unmapped,
  // connections closed, their threads joined) before the next one connects.
  std::shared_ptr<detail::Backend> old = std::move(s_.backend);
  std::unique_ptr<detail::OpProgress> oldProgress = std::move(progress_);
  lock.unlock();
  old.reset();
  oldProgress.reset();
  detail::FormedGeneration f;
  try {
    f = detail::formNewest(*s_.recovery, from, newest, s_.connect, {s_.rank, s_.size}, deadline.remaining());
  } catch (...) {
    std::lock_guard relock(mutex_);
    reforming_ = false;
    throw;  // the communicator stays broken; reform() may be called again
  }
  lock.lock();
  s_.backend = std::move(f.backend);
  const int rankBefore = s_.rank, sizeBefore = s_.size;
  s_.rank = f.place.rank;  // a shrink renumbered the world, a grow made it larger
  s_.size = f.place.size;
  s_.worldRanks.clear();
  for (int i = 0; i < s_.size; ++i) s_.worldRanks.push_back(i);
  s_.worldStore = std::move(f.store);
  s_.liveness = std::move(f.liveness);
  progress_ = makeProgress();
  collectives_ = 0;  // the newcomers count from 0: progress keys and marks must agree
  check_.restart();  // and the mismatch check's comparisons with them
  groupSeq_ = 0;
  groups_.clear();
  broken_.reset();
  reforming_ = false;
  generation_.store(f.generation, std::memory_order_release);
  lock.unlock();
  spdlog::debug("drun_comm: rank {} of {} reformed as rank {} of {}: generation {} -> {}", rankBefore, sizeBefore,
                f.place.rank, f.place.size, from, f.generation);
  followRecovery();
}

}  // namespace drun::comm

#include <algorithm>
#include <set>

#include <spdlog/spdlog.h>

#include "communicator_impl.hpp"
#include "drun/store/prefix_store.hpp"
#include "drun/worker.h"
#include "drun/common/owned_thread.hpp"
#include "op_progress.hpp"
#include "request_states.hpp"
#include "store_host.hpp"

namespace drun::comm {

using detail::Collective;
using detail::OpKind;
using detail::isReduction;
using detail::isRooted;

Communicator::Impl::Impl(Setup setup) : s_(std::move(setup)), check_(s_.check), generation_(s_.generation) {
  progress_ = makeProgress();
}

std::unique_ptr<detail::OpProgress> Communicator::Impl::makeProgress() const {
  if (!s_.worldStore || s_.rank < 0 || s_.size <= 1) return nullptr;
  std::string key = s_.name;  // "group 3" -> "group3"
  std::erase(key, ' ');
  return std::make_unique<detail::OpProgress>(s_.worldStore, key, s_.name, s_.rank, s_.size);
}

Communicator::Impl::~Impl() {
  try {
    destroy();
  } catch (...) {
    // Destructors do not throw; destroy() already bounded every wait.
  }
}

milliseconds Communicator::Impl::resolve(milliseconds timeout) const {
  if (timeout == kDefaultTimeout) return s_.timeout;
  if (timeout <= milliseconds(0))
    throw InvalidArgument("timeout must be positive (or kDefaultTimeout), got " +
                          std::to_string(timeout.count()) + "ms");
  return timeout;
}

void Communicator::Impl::checkUsable(const char* what) {
  std::lock_guard lock(mutex_);
  checkUsableLocked(what);
}

std::string Communicator::Impl::transport() const {
  std::lock_guard lock(mutex_);
  return s_.backend ? s_.backend->transport() : "";
}

void Communicator::Impl::checkUsableLocked(const char* what) const {
  if (destroyed_)
    throw InvalidArgument(std::string(what) + ": the communicator was destroyed");
  if (s_.rank < 0)
    throw InvalidArgument(std::string(what) + ": this process (world rank " +
                          std::to_string(s_.world ? s_.world->rank() : -1) +
                          ") is not a member of " + s_.name);
  if (s_.world && s_.world->generation() != generation())
    throw InvalidArgument(std::string(what) + ": " + s_.name + " belongs to generation " +
                          std::to_string(generation()) + " and must be made again with newGroup() (the world is at generation " +
                          std::to_string(s_.world->generation()) + ")");
  throwIfBrokenLocked(what);
  if (reforming_) throw InvalidArgument(std::string(what) + ": reform() is in progress");
}

void Communicator::Impl::throwIfBrokenLocked(const char* what) const {
  if (!broken_) return;
  std::string msg = std::string(what) + ": the communicator is unusable since an earlier failure: " +
                    broken_->message;
  if (broken_->kind == Broken::Kind::Timeout) throw TimeoutError(msg);
  throw CommError(msg);
}

void Communicator::Impl::throwIfBroken(const char* what) const {
  std::lock_guard lock(mutex_);
  throwIfBrokenLocked(what);
}

void Communicator::Impl::fail(const char* what, std::exception_ptr error, const std::string& context,
                              std::optional<uint64_t> generation) {
  std::string detail;
  bool timeout = false;
  try {
    std::rethrow_exception(error);
  } catch (const InvalidArgument&) {
    throw;  // misuse found before anything went on the wire: the communicator stays usable
  } catch (const TimeoutError& e) {
    timeout = true;
    detail = e.what();
  } catch (const Error& e) {
    detail = e.what();
  } catch (const std::exception& e) {
    detail = e.what();
  } catch (...) {
    detail = "unknown error";
  }
  const std::string where = std::string(what) + " failed on rank " + std::to_string(s_.rank) + " of " +
                            std::to_string(s_.size) + (s_.world ? " in " + s_.name : std::string()) + ": ";
  if (generation && *generation != this->generation())  // an operation of an earlier generation
    throw CommError(where + "it belongs to generation " + std::to_string(*generation) +
                    ", the communicator is at generation " + std::to_string(this->generation()) + " now; " + detail);
  std::shared_ptr<detail::Liveness> liveness;
  {
    std::lock_guard lock(mutex_);
    if (broken_ && broken_->kind == Broken::Kind::Generation) {
      spdlog::debug("drun_comm: {}{} (as the transport said it)", where, detail);
      throw CommError(where + broken_->message);
    }
    liveness = s_.liveness;
  }
  // A newer generation explains any failure (a peer that aborted for it may be seen first);
  // not a grow, which loses nobody.
  if (auto [newest, why] = newerGeneration();
      newest > 0 && !(recovery() && recovery()->growsOnly(this->generation(), newest))) {
    generationBegan(newest, why, false);
    throw CommError(where + why);
  }
  // A peer's death shows first on its sockets; its will reaches the store a moment later.
  std::string gone = liveness ? liveness->describeGone(timeout ? 0ms : std::min(s_.timeout, 2000ms))
                              : std::string();
  if (s_.world && !gone.empty()) gone = "world " + gone;  // liveness speaks of world ranks
  std::string msg = where + (gone.empty() ? "" : gone + "; ") + (context.empty() ? "" : context + "; ") + detail;
  std::shared_ptr<detail::Backend> backend;
  {
    std::lock_guard lock(mutex_);
    if (!broken_) broken_ = Broken{timeout ? Broken::Kind::Timeout : Broken::Kind::Failure, msg};
    backend = s_.backend;
  }
  if (backend) backend->abort();
  if (timeout) throw TimeoutError(msg);
  throw CommError(msg);
}

void Communicator::Impl::execute(const Collective& c) {
  // drun's hang detection (docs/hangs.md): a rank silent inside a collective is a waiter.
  // With a progress watchdog, OpProgress marks a collective in the worker channel about once a
  // poll (and every one stuck); without one, every collective is marked here.
  const uint64_t n = ++collectives_;
  const char* kind = toString(c.kind);
  if (progress_) {
    progress_->entered(n, kind, c.timeout);
  } else {
    char entered[160];
    detail::OpProgress::describe(entered, kind, n, s_.name);
    drun_worker_collective_begin(entered);
  }
  struct Left {
    detail::OpProgress* progress;
    ~Left() {
      if (progress) progress->left();
      else drun_worker_collective_end();
    }
  } left{progress_.get()};
  try {
    // Fingerprints travel as a small all_gather of the collective's own transport.
    check_.before(c, rank(), size(), [&](const int64_t* mine, int64_t* all, size_t count) {
      s_.backend->run({OpKind::AllGather, mine, all, count, DType::Int64, ReduceOp::Sum, 0, c.timeout});
    });
    if (c.kind == OpKind::Barrier || c.count > 0) s_.backend->run(c);
  } catch (const TimeoutError&) {
    // Who never came: every rank in the op published it within a second of entering.
    std::string absent;
    if (progress_) {
      char entered[160];
      detail::OpProgress::describe(entered, kind, n, s_.name);
      absent = progress_->describeAbsent(n, entered);
    }
    fail(toString(c.kind), std::current_exception(), absent);
  } catch (...) {
    fail(toString(c.kind), std::current_exception());
  }
}

Request Communicator::Impl::collective(Collective c, bool async) {
  const char* what = toString(c.kind);
  // One lock for the checks and the start (small collectives are a few hundred ns: each lock
  // round trip counts).
  std::unique_lock lock(mutex_);
  checkUsableLocked(what);
  c.timeout = resolve(c.timeout);
  if (c.kind != OpKind::Barrier) {
    dtypeSize(c.dtype);  // validates
    const bool root = rank() == c.root;
    const bool needsSend = c.kind == OpKind::Gather || c.kind == OpKind::AllGather ||
                           c.kind == OpKind::ReduceScatter || c.kind == OpKind::AllToAll ||
                           (c.kind == OpKind::Scatter && root);
    const bool needsRecv = c.kind != OpKind::Gather || root;
    if (c.count > 0 && ((needsSend && !c.send) || (needsRecv && !c.recv)))
      throw InvalidArgument(std::string(what) + ": a null " + (needsSend && !c.send ? "send" : "receive") +
                            " buffer for " + std::to_string(c.count) + " elements");
  }
  if (isRooted(c.kind) && (c.root < 0 || c.root >= size()))
    throw InvalidArgument(std::string(what) + ": root " + std::to_string(c.root) +
                          " is not a rank of " + s_.name + " (size " + std::to_string(size()) + ")");
  if (isReduction(c.kind)) checkOpFits(c.op, c.dtype);
  // Nothing to move; under the full check it is compared all the same.
  if (c.kind != OpKind::Barrier && c.count == 0 && s_.check.mode != detail::CheckMode::Every)
    return Request(std::make_shared<detail::CompletedRequest>());

  if (!async && queue_.empty() && !running_) {
    running_ = true;
    lock.unlock();
    struct Done {
      Impl* self;
      ~Done() {
        std::lock_guard l(self->mutex_);
        self->running_ = false;
        self->cv_.notify_all();
      }
    } done{this};
    execute(c);
    return Request();
  }
  if (stopping_) throw InvalidArgument(std::string(what) + ": the communicator was destroyed");
  auto work = std::make_shared<detail::AsyncWork>(shared_from_this(), c);
  queue_.push_back(work);
  if (!worker_.joinable()) worker_ = spawnThreadWithSignalsBlocked([this] { workerLoop(); });
  cv_.notify_all();
  lock.unlock();
  if (!async) {
    work->wait(kDefaultTimeout);
    return Request();
  }
  return Request(work);
}

void Communicator::Impl::workerLoop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || (!queue_.empty() && !running_); });
    if (queue_.empty()) return;  // stopping, nothing left
    auto work = queue_.front();
    queue_.pop_front();
    running_ = true;
    lock.unlock();
    work->run();  // catches everything: no exception leaves this thread
    lock.lock();
    running_ = false;
    cv_.notify_all();
  }
}

Request Communicator::Impl::p2p(bool isSend, void* buf, size_t count, DType dtype, int peer,
                                int tag, milliseconds timeout) {
  const char* what = isSend ? "send" : "recv";
  std::shared_ptr<detail::Backend> backend;
  uint64_t generation;
  {
    std::lock_guard lock(mutex_);
    checkUsableLocked(what);
    backend = s_.backend;
    generation = this->generation();
  }
  timeout = resolve(timeout);
  const size_t bytes = count * dtypeSize(dtype);
  const bool any = !isSend && peer == kAnySource;
  if (!any && (peer < 0 || peer >= size()))
    throw InvalidArgument(std::string(what) + ": rank " + std::to_string(peer) + " is not a rank of " +
                          s_.name + " (size " + std::to_string(size()) + ")");
  if (peer == rank())
    throw InvalidArgument(std::string(what) + ": rank " + std::to_string(peer) + " is this rank itself");
  if (any && size() == 1) throw InvalidArgument("recv from any source: no other rank in " + s_.name);
  if (tag < 0) throw InvalidArgument(std::string(what) + ": tag must be >= 0, got " + std::to_string(tag));
  if (bytes > 0 && !buf) throw InvalidArgument(std::string(what) + ": null buffer");
  std::shared_ptr<Request::State> inner;
  try {
    inner = isSend ? backend->isend(buf, bytes, peer, tag, timeout)
                   : backend->irecv(buf, bytes, peer, tag, timeout);
  } catch (...) {
    fail(what, std::current_exception(), {}, generation);
  }
  return Request(std::make_shared<detail::P2PRequest>(shared_from_this(), std::move(inner), what, generation));
}

std::shared_ptr<Communicator> Communicator::Impl::newGroup(const std::vector<int>& ranks,
                                                           milliseconds timeout) {
  checkUsable("new_group");
  timeout = resolve(timeout);
  Impl& world = s_.world ? *s_.world : *this;
  if (ranks.empty()) throw InvalidArgument("new_group: the rank list is empty");
  std::set<int> seen;
  Setup g;
  for (int r : ranks) {
    if (r < 0 || r >= size())
      throw InvalidArgument("new_group: rank " + std::to_string(r) + " is not a rank of " + s_.name +
                            " (size " + std::to_string(size()) + ")");
    if (!seen.insert(r).second)
      throw InvalidArgument("new_group: rank " + std::to_string(r) + " is listed twice");
    g.worldRanks.push_back(s_.worldRanks[static_cast<size_t>(r)]);
  }
  int seq;
  {
    std::lock_guard lock(world.mutex_);
    seq = ++world.groupSeq_;
  }
  g.generation = generation();
  g.kind = s_.kind;
  g.worldStore = s_.worldStore;
  g.timeout = s_.timeout;
  g.liveness = s_.liveness;
  g.plan = s_.plan;
  g.world = s_.world ? s_.world : shared_from_this();
  g.name = "group " + std::to_string(seq);
  g.check = s_.check;
  g.size = static_cast<int>(ranks.size());
  auto me = std::find(ranks.begin(), ranks.end(), rank());
  g.rank = me == ranks.end() ? -1 : static_cast<int>(me - ranks.begin());
  if (g.rank >= 0) {
    auto store = std::make_shared<rdzv::PrefixStore>("group" + std::to_string(seq) + "/", s_.worldStore);
    try {
      g.backend = s_.plan ? s_.plan->make(store, g.rank, g.size, timeout)
                          : s_.backend->makeGroup(store, g.rank, g.size, timeout);
    } catch (...) {
      fail("new_group", std::current_exception());
    }
  }
  auto group = std::make_shared<Impl>(std::move(g));
  {
    std::lock_guard lock(world.mutex_);
    std::erase_if(world.groups_, [](const std::weak_ptr<Impl>& w) { return w.expired(); });
    world.groups_.push_back(group);
  }
  return std::make_shared<Communicator>(std::move(group));
}

void Communicator::Impl::destroy() {
  {
    std::unique_lock lock(mutex_);
    if (destroyed_) return;
    destroyed_ = true;
    stopping_ = true;
    cv_.notify_all();
  }
  if (s_.recovery) s_.recovery->stop();  // no generation news during the goodbye
  if (worker_.joinable()) worker_.join();  // runs what is queued: each bounded by its deadline
  if (!s_.world && s_.rank >= 0) leaveWorld();
  std::shared_ptr<detail::Backend> backend;
  {
    std::lock_guard lock(mutex_);
    backend = std::move(s_.backend);
  }
}

// The world's goodbye: disarm the will, count out, and on the store's host keep serving until
// every rank left or is known gone (bounded by the timeout), so nobody loses the store early.
void Communicator::Impl::leaveWorld() {
  if (!s_.worldStore) return;
  try {
    if (s_.liveness) s_.liveness->disarm();
    int64_t left = s_.worldStore->add("left", 1);
    if (!s_.storeHost) return;
    Deadline deadline(s_.timeout);
    while (left + (s_.liveness ? s_.liveness->goneCount() : 0) < s_.size && !deadline.expired()) {
      try {
        auto v = s_.worldStore->watch("left", std::to_string(left),
                                      std::min(deadline.remaining(), milliseconds(200)));
        if (v) left = std::stoll(*v);
      } catch (const TimeoutError&) {
        // re-check the gone count, then watch again
      }
    }
  } catch (const std::exception&) {
    // The store is gone: nothing left to say goodbye to.
  }
}

}  // namespace drun::comm

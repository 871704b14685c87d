// Communicator::Impl: the front end shared by every backend: argument checks, the order of
// collectives (inline on the caller's thread, or queued behind pending asynchronous ones on one
// worker thread), the broken state after a failure, error messages naming the failed peer, groups,
// generations (in-process recovery: reform.cpp) and the orderly exit. Internal to libdrun_comm.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "backend.hpp"
#include "liveness.hpp"
#include "mismatch_check.hpp"
#include "recovery.hpp"
#include "transport.hpp"

namespace drun::comm {

class StoreHost;  // store_host.hpp

namespace detail {
class AsyncWork;
class OpProgress;
// Connects the world's transports of a generation through its store (drun_comm/g<g>/), as
// `rank` of `size` (a shrink renumbers the ranks).
using GenerationConnector = std::function<std::shared_ptr<Backend>(std::shared_ptr<rdzv::Store> store, int rank,
                                                                   int size, milliseconds timeout)>;
struct FormedGeneration {
  uint64_t generation = 0;
  Recovery::Place place;  // this rank and the size in it
  std::shared_ptr<rdzv::LivenessStore> store;  // drun_comm/g<g>/ of the workers' store
  std::shared_ptr<Liveness> liveness;          // armed
  std::shared_ptr<Backend> backend;
};
// reform.cpp: connects the newest generation (at least `atLeast`): joined, the transports,
// formed; a generation superseded while it forms is abandoned for the newest, within `timeout`.
// `place` is this rank in generation `base`; the shrinks after it renumber it.
FormedGeneration formNewest(Recovery& recovery, uint64_t base, uint64_t atLeast, const GenerationConnector& connect,
                            Recovery::Place place, milliseconds timeout);
}

class Communicator::Impl : public std::enable_shared_from_this<Communicator::Impl> {
 public:
  struct Setup {
    std::shared_ptr<detail::Backend> backend;  // null for a non-member
    std::shared_ptr<detail::TransportPlan> plan;  // gloo: how groups pick their transport
    Backend kind = Backend::Gloo;
    std::shared_ptr<rdzv::LivenessStore> worldStore;   // "drun_comm/" of the store
    int rank = 0;                              // in this communicator, -1 for a non-member
    int size = 1;
    std::vector<int> worldRanks;
    milliseconds timeout{0};
    std::shared_ptr<detail::Liveness> liveness;
    std::shared_ptr<StoreHost> storeHost;      // world on the store's host only
    std::shared_ptr<Impl> world;               // groups: the world communicator
    std::string name = "world";                // "world" or "group 3", for messages
    detail::CheckOptions check{detail::CheckMode::Off};  // the mismatch check (InitOptions)
    uint64_t generation = 0;                   // in-process recovery's generation
    // World with a workers' store only: the recovery keys and watcher, and how reform()
    // connects a new generation's transports.
    std::shared_ptr<detail::Recovery> recovery;
    detail::GenerationConnector connect;
  };
  explicit Impl(Setup setup);
  ~Impl();

  int rank() const { return s_.rank; }
  int size() const { return s_.size; }
  bool isMember() const { return s_.rank >= 0; }
  Backend kind() const { return s_.kind; }
  milliseconds timeout() const { return s_.timeout; }
  const std::vector<int>& worldRanks() const { return s_.worldRanks; }
  std::string transport() const;
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

  std::shared_ptr<Communicator> newGroup(const std::vector<int>& ranks, milliseconds timeout);
  Request collective(detail::Collective c, bool async);
  Request p2p(bool isSend, void* buf, size_t count, DType dtype, int peer, int tag,
              milliseconds timeout);
  void destroy();
  // reform.cpp: the world moves to the newest generation (Communicator::reform).
  void reform(milliseconds timeout);
  // The world (with a workers' store): starts following recovery/generation.
  void followRecovery();
  // The world's recovery (a group's: its world's); null without a workers' store.
  detail::Recovery* recovery() const;

  // Checks that the communicator can run `what` now; throws the reason.
  void checkUsable(const char* what);
  void checkUsableLocked(const char* what) const;  // with mutex_ held
  // A queued collective starts only while the communicator is not broken.
  void throwIfBroken(const char* what) const;
  void throwIfBrokenLocked(const char* what) const;
  bool isBroken() const;
  milliseconds resolve(milliseconds timeout) const;
  // Turns any failure of `what` into drun's error (naming the lost peer when known), marks the
  // communicator broken for TimeoutError / CommError, and throws it.
  // `context`: what else is known (the ranks that never entered the timed-out collective).
  // `generation`: the operation's, when it may be older than the communicator's (a request
  // made before reform()): such a failure leaves the communicator as it is.
  [[noreturn]] void fail(const char* what, std::exception_ptr error, const std::string& context = {},
                         std::optional<uint64_t> generation = std::nullopt);

 private:
  friend class detail::AsyncWork;
  void execute(const detail::Collective& c);  // runs c via the backend; errors through fail()
  void workerLoop();
  void leaveWorld();
  std::unique_ptr<detail::OpProgress> makeProgress() const;  // members of 2+ ranks with a store
  // reform.cpp: a generation past this communicator's began (the watcher, or a failure that
  // found it): broken with `why`, pending operations aborted, the world's groups too.
  void generationBegan(uint64_t newest, const std::string& why, bool grow);
  // reform.cpp: (3, "generation 3 began: ...") when a generation past this communicator's
  // began, else (0, "").
  std::pair<uint64_t, std::string> newerGeneration();

  // Why the communicator is broken: the first TimeoutError, CommError, or a newer generation.
  struct Broken {
    enum class Kind { Timeout, Failure, Generation };
    Kind kind;
    std::string message;
  };

  Setup s_;
  uint64_t collectives_ = 0;  // collectives executed, for drun's worker channel ("all_reduce #42")
  detail::MismatchCheck check_;  // on the thread that runs collectives
  std::unique_ptr<detail::OpProgress> progress_;  // members of 2+ ranks with a store
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<detail::AsyncWork>> queue_;
  bool running_ = false;   // a collective is executing (inline or on the worker)
  bool stopping_ = false;
  bool destroyed_ = false;
  std::thread worker_;
  std::optional<Broken> broken_;
  bool reforming_ = false;  // world: reform() is replacing the transports
  int groupSeq_ = 0;  // world only: groups created so far (in this generation)
  std::vector<std::weak_ptr<Impl>> groups_;  // world only: this generation's groups
  std::atomic<uint64_t> generation_{0};
};

}  // namespace drun::comm

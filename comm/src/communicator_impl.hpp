// Communicator::Impl: the front end shared by every backend: argument checks, the order of
// collectives (inline on the caller's thread, or queued behind pending asynchronous ones on one
// worker thread), the broken state after a failure, error messages naming the failed peer, groups
// and the orderly exit. Internal to libdrun_comm.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "backend.hpp"
#include "liveness.hpp"
#include "transport.hpp"

namespace drun::comm {

class StoreHost;  // store_host.hpp

namespace detail {
class AsyncWork;
class OpProgress;
}

class Communicator::Impl : public std::enable_shared_from_this<Communicator::Impl> {
 public:
  struct Setup {
    std::unique_ptr<detail::Backend> backend;  // null for a non-member
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
    bool checkCollectives = false;             // compare fingerprints first (InitOptions)
  };
  explicit Impl(Setup setup);
  ~Impl();

  int rank() const { return s_.rank; }
  int size() const { return s_.size; }
  bool isMember() const { return s_.rank >= 0; }
  Backend kind() const { return s_.kind; }
  milliseconds timeout() const { return s_.timeout; }
  const std::vector<int>& worldRanks() const { return s_.worldRanks; }
  std::string transport() const { return s_.backend ? s_.backend->transport() : ""; }

  std::shared_ptr<Communicator> newGroup(const std::vector<int>& ranks, milliseconds timeout);
  Request collective(detail::Collective c, bool async);
  Request p2p(bool isSend, void* buf, size_t count, DType dtype, int peer, int tag,
              milliseconds timeout);
  void destroy();

  // Checks that the communicator can run `what` now; throws the reason.
  void checkUsable(const char* what);
  void checkUsableLocked(const char* what) const;  // with mutex_ held
  milliseconds resolve(milliseconds timeout) const;
  // Turns any failure of `what` into drun's error (naming the lost peer when known), marks the
  // communicator broken for TimeoutError / CommError, and throws it.
  // `context`: what else is known (the ranks that never entered the timed-out collective).
  [[noreturn]] void fail(const char* what, std::exception_ptr error, const std::string& context = {});

 private:
  friend class detail::AsyncWork;
  void execute(const detail::Collective& c);  // runs c via the backend; errors through fail()
  void compareFingerprints(const detail::Collective& c);
  void workerLoop();
  void leaveWorld();

  Setup s_;
  uint64_t collectives_ = 0;  // collectives executed, for drun's worker channel ("all_reduce #42")
  std::unique_ptr<detail::OpProgress> progress_;  // members of 2+ ranks with a store
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<detail::AsyncWork>> queue_;
  bool running_ = false;   // a collective is executing (inline or on the worker)
  bool stopping_ = false;
  bool destroyed_ = false;
  std::thread worker_;
  std::optional<std::pair<bool, std::string>> broken_;  // (is timeout, message)
  int groupSeq_ = 0;  // world only: groups created so far
};

}  // namespace drun::comm

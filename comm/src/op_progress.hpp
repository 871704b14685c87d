// OpProgress: which ranks of a communicator entered a collective that timed out, so that the
// timeout names the ranks that never came ("rank 3 never entered all_reduce #7") instead of
// leaving every waiter to say only "timed out".
//
// Cost: a collective that ends within `publishAfter` (1 s, or a quarter of its timeout when
// shorter) writes nothing. A watchdog thread (started at the first collective, polling every
// 100 ms) publishes "in #n" for a collective that runs longer: one store write per slow
// collective per rank. A rank whose collective times out publishes its own, waits up to a grace
// for the others' (every rank in the op publishes within publishAfter of entering it, and their
// count is one counter, watched), then reads the ranks' entries (at most kMaxNamed of them
// named) and names those whose latest is below n.
//
// Keys (under the communicator's store, "drun_comm/"): progress/<comm>/<rank> = n,
// progress/<comm>/in/<n> = how many ranks published n.
//
// The worker channel (drun/worker.h, drun's hang detection): a collective is marked there
// ("all_reduce #42 of world", a heartbeat at its start and end) when it is the first one after a
// poll, or by the watchdog when it finds one in progress that is not marked; so a rank in a loop
// of collectives beats at least once a poll, and a rank stuck in one is marked as its waiter
// within about a poll (drun's hang timeouts are seconds). Marking every collective would cost
// two clock reads, two locks and two 64-byte copies each, a large part of an 8-byte broadcast
// (docs/benchmarks/comm.md).
// Without a watchdog (it could not start) every collective is marked.
// Threading: entered()/left() from the collective's thread (atomic stores, no clock read, no
// store call; a lock only to mark or unmark the channel: the watchdog times a collective from
// the poll that first saw it); describeAbsent() from the failing thread; the watchdog's store
// calls have the store's own deadlines. Ownership: shares the world's store.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "drun/common/deadline.hpp"
#include "drun/store/store.hpp"

namespace drun::comm::detail {

class OpProgress {
 public:
  struct Options {
    milliseconds publishAfter{1000};
    milliseconds poll{100};
  };
  static constexpr size_t kMaxNamed = 64;  // above this, the absent ranks are counted, not named

  // commKey: a store-safe name of the communicator ("world", "group3"); commName: its name in
  // messages ("group 3"); rank and size: in it.
  OpProgress(std::shared_ptr<rdzv::LivenessStore> store, std::string commKey, std::string commName,
             int rank, int size, Options options);
  OpProgress(std::shared_ptr<rdzv::LivenessStore> store, std::string commKey, std::string commName,
             int rank, int size)
      : OpProgress(std::move(store), std::move(commKey), std::move(commName), rank, size, Options{}) {}
  ~OpProgress();
  OpProgress(const OpProgress&) = delete;
  OpProgress& operator=(const OpProgress&) = delete;

  // `kind` names it in the channel (a string literal: toString(OpKind)).
  void entered(uint64_t n, const char* kind, milliseconds timeout);
  void left();
  // "all_reduce #42 of world" (at most 159 bytes) into `out`.
  static void describe(char (&out)[160], const char* kind, uint64_t n, const std::string& commName);
  // "rank 3 never entered all_reduce #7 of world", or "" when every rank is known to have
  // entered it or nothing could be learned. `what`: "all_reduce #7 of world".
  // Waits up to the op's publishAfter plus two polls for the others' entries.
  std::string describeAbsent(uint64_t n, const std::string& what);

 private:
  void watch();
  void publish(uint64_t n);
  // Marks collective n in the worker channel unless it is marked or (watchdog) already over.
  void mark(uint64_t n, bool fromWatchdog);
  std::string rankKey(int worldRank) const;
  std::string countKey(uint64_t n) const;

  std::shared_ptr<rdzv::LivenessStore> store_;
  const std::string commKey_;
  const std::string commName_;
  const int rank_;
  const int size_;
  const Options options_;

  std::atomic<uint64_t> current_{0};        // the collective in progress (0: none)
  std::atomic<const char*> kind_{nullptr};  // its kind (a literal)
  std::atomic<bool> markDue_{true};         // the next collective marks itself (set by each poll)
  std::atomic<bool> watching_{false};       // the watchdog runs
  std::atomic<uint64_t> marked_{0};         // the collective marked in the worker channel (0: none)
  std::mutex markMutex_;                    // one marker at a time (collective's thread, watchdog)
  std::atomic<int64_t> publishAfterNs_{0};  // for it
  std::mutex publishMutex_;                 // one publish at a time (watchdog, failing thread)
  uint64_t published_ = 0;                  // under publishMutex_

  std::mutex stopMutex_;
  std::condition_variable stopCv_;
  bool stopping_ = false;
  std::once_flag started_;
  std::thread watchdog_;
};

}  // namespace drun::comm::detail

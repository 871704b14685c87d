// JobMonitor: what drun-rendezvous --http shows, kept up to date from the store's writes
// (StoreCore::observeWrites) on the server's io thread: each job's history (its events as the
// agents append them, kept after the job's keys are removed: the last kMaxEndedJobs ended jobs),
// its rounds (opened at the first joiner's `count`, closed at the decision's `state`: the
// round-close latency histogram), its restart count (from the decision).
//
// Threading: io thread only (the observer and the HTTP handlers run there). Everything it reads
// from the store is untrusted: bad values are skipped, never thrown.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "drun/store/store.hpp"
#include "job_counters.hpp"

namespace drun::rdzv::monitor {

// Upper bounds (seconds) of the round-close latency histogram's buckets (+Inf is implied).
inline constexpr std::array<double, 12> kCloseBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                         0.1,   0.25,   0.5,   1,    5,     30};

class JobMonitor {
 public:
  static constexpr size_t kMaxEndedJobs = 64;
  static constexpr size_t kMaxTrackedJobs = 4096;  // beyond it new jobs are not tracked

  struct Job {
    std::deque<nlohmann::json> events;  // by seq, the last keys::kEventSlots
    std::map<uint64_t, std::chrono::steady_clock::time_point> opened;  // rounds not closed yet
    uint64_t roundsClosed = 0;
    int64_t restarts = 0;
    uint64_t cancels = 0;  // job_cancelled events: nodes whose drun or workers were signalled
    JobCounters counters;  // lost nodes, restarts by cause, hangs
    int64_t nodes = 0;
    int64_t worldSize = 0;
    std::string outcome;  // "succeeded" / "failed" once the job's `outcome` is written
    bool present = true;  // it still has keys
    std::chrono::steady_clock::time_point endedAt;
  };

  // The store's write observer.
  void onWrite(const std::string& key, const Bytes* value);

  // One job: summarizeJob(...) + "present", "rounds_closed", "restarts_decided"; each round also
  // "ended_ts_ms" (its last failure, loss, restart or end; null while it runs) and "exits"
  // ([{"rank","node","code","signal_name"}] of its workers, the first 64), each round's node
  // "name" (as the round named it: "host(address)" when they differ); "first_ts_ms" (the oldest
  // event kept).
  nlohmann::json summary(const std::string& runId, const Job& job) const;
  // /api/jobs: {"jobs": [summary...]}.
  nlohmann::json jobsJson() const;
  const std::map<std::string, Job>& jobs() const { return jobs_; }
  // The histogram: counts per bucket (cumulative as Prometheus wants), sum, count.
  std::array<uint64_t, kCloseBuckets.size()> closeBucketCounts() const { return closeBuckets_; }
  double closeSecondsSum() const { return closeSum_; }
  uint64_t closeCount() const { return closeCount_; }

 private:
  Job* jobOf(const std::string& runId);
  void onEvent(Job& job, const Bytes& value);
  void onRoundKey(Job& job, uint64_t round, const std::string& leaf, const Bytes* value);
  void forgetEnded();

  std::map<std::string, Job> jobs_;
  std::array<uint64_t, kCloseBuckets.size()> closeBuckets_{};
  double closeSum_ = 0;
  uint64_t closeCount_ = 0;
};

}  // namespace drun::rdzv::monitor

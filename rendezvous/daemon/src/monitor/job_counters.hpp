// JobCounters: one job's monotonic counters for /metrics, counted from its events as they arrive
// (each event once: JobMonitor drops the ones it already has). Events of one loss or one restart
// come from every node that learned it, so each is counted once per round:
//   lost nodes     distinct (round, reason) of node_lost
//   restarts       each round that formed after an earlier one, by what ended the earlier round:
//                  "failure" (a failure_recorded), "node_lost", "scale_up" (a node_waiting),
//                  "store_lost", else "other"; a round that carried its workers on
//                  (round_continued) is counted under its cause too: the round re-formed
//   hangs          hang_detected (written once, by the hung rank's node)
// Threading: the JobMonitor's (io thread only). Untrusted input: fields of the wrong type are
// ignored, never thrown.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

namespace drun::rdzv::monitor {

class JobCounters {
 public:
  static constexpr size_t kRoundsKept = 16;     // rounds whose events are remembered
  static constexpr size_t kLossesKept = 256;    // (round, reason) pairs remembered

  void onEvent(const nlohmann::json& event);

  uint64_t lostNodes() const { return lostNodes_; }
  uint64_t hangs() const { return hangs_; }
  // cause -> restarts; every cause is present (0 until one happens).
  const std::map<std::string, uint64_t>& restartsByCause() const { return restarts_; }

 private:
  struct RoundSeen {
    bool failure = false, lost = false, waiting = false, storeLost = false;
  };
  std::string causeBefore(int64_t round) const;

  std::map<int64_t, RoundSeen> rounds_;
  int64_t latestFormed_ = -1;
  std::set<std::pair<int64_t, std::string>> losses_;
  uint64_t lostNodes_ = 0;
  uint64_t hangs_ = 0;
  std::map<std::string, uint64_t> restarts_ = {
      {"failure", 0}, {"node_lost", 0}, {"scale_up", 0}, {"store_lost", 0}, {"other", 0}};
};

}  // namespace drun::rdzv::monitor

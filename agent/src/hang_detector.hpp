// HangDetector: decides from what the workers' channels say (drun/worker_channel.h) whether a
// rank is hung, by the rules of HangOptions: silence (no heartbeat for the timeout), a section
// past its timeout (heartbeats or not), learned timeouts (auto). No heartbeat ever: no verdict.
// readChannel() reads one page with pread() and validates every byte (a worker wrote it).
//
// Threading: not thread-safe; the agent's loop owns it. Pure logic, time passed in (tests drive
// it with their own clock). LearnedTimeouts outlives the detectors of each round (the agent
// keeps it across restarts).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "drun/agent/hang_options.hpp"

namespace drun::agent::detail {

struct ChannelReading {
  bool valid = false;
  std::string problem;  // why not valid ("short read", "bad magic", "section name not printable")
  uint64_t beats = 0;
  int64_t lastBeatNs = 0;
  uint64_t sectionSeq = 0;
  int64_t sectionStartNs = 0;
  std::string section;  // "" = none
  std::string collective;     // "all_reduce #42 of world" while inside one ("" = none)
  int64_t collectiveStartNs = 0;
  bool sectionStable = true;  // false: the seqlock was busy (the section fields are last poll's)
};

// Reads and validates the page behind `fd`. Never throws (a bad page is !valid, with why).
ChannelReading readChannel(int fd) noexcept;
// Creates the page at `path` (size, magic, version; mode 0600); returns the agent's read fd.
int createChannel(const std::string& path);

// What the learned mode has seen: per key ("" = heartbeat intervals, else a section name) the
// longest interval and how many were seen. Shared by every rank of the node.
struct LearnedTimeouts {
  struct Seen {
    int64_t longestNs = 0;
    int count = 0;
    int64_t spanNs = 0;  // the intervals' sum (the warm-up's span)
  };
  std::map<std::string, Seen> seen;
  // forget() counts up: values of an older generation (another node's, in the store) are dropped.
  uint64_t generation = 0;
  void note(const std::string& key, int64_t intervalNs, int times = 1);  // `times` intervals of about that
  void forget();  // a learned timeout called a hang: the restarted job learns afresh
  // As text for the store: "g <generation>", then one line per key: "k<hex key> <longest ns>
  // <count> <span ns>".
  std::string encode() const;
  // What other nodes (and earlier rounds) saw, as encode() wrote it: of the same generation the
  // larger of each wins; a newer generation replaces ours, an older one is ignored. Untrusted
  // (another node wrote it): bad lines are skipped, at most kMaxKeys keys are kept.
  void mergeEncoded(const std::string& text);
  static constexpr size_t kMaxKeys = 256;
  // The learned timeout for `key` once warm, else nullopt.
  std::optional<std::chrono::milliseconds> timeout(const std::string& key, const HangOptions& o) const;
};

struct HangVerdict {
  std::string rule;     // "no heartbeat", "section", "learned", "idle"
  std::string section;  // the section it is in ("" = none)
  std::chrono::milliseconds silentFor{0};     // since its last heartbeat
  std::chrono::milliseconds inSectionFor{0};  // since the section began (0: none)
  std::chrono::milliseconds timeout{0};       // the one it exceeded
  std::string collective;                     // it waits inside this collective ("" = none)
  std::chrono::milliseconds inCollectiveFor{0};
  // "no heartbeat for 5.2s (hang timeout 5s), in section "step" for 7.1s"
  std::string describe() const;
};

class HangDetector {
 public:
  HangDetector(const HangOptions& options, int ranks, LearnedTimeouts* learned);
  // A new reading of local rank `rank` at `nowNs` (CLOCK_MONOTONIC).
  void observe(int rank, const ChannelReading& reading, int64_t nowNs);
  std::optional<HangVerdict> check(int rank, int64_t nowNs) const;
  // A rank that exited is no longer checked.
  void retire(int rank);
  // A new process took the rank's place (an in-process recovery): checked afresh.
  void revive(int rank);
  bool everBeat(int rank) const;
  // Its stack shows it waiting for a peer (hang_blame.hpp): until it beats again it gets the
  // waiter's grace (twice its timeout), as a rank whose channel names a collective.
  void markWaiting(int rank);
  std::string collective(int rank) const;  // what its channel says it waits in, or ""

 private:
  struct Rank {
    bool live = true;
    bool beating = false;  // a heartbeat was seen
    uint64_t beats = 0;
    int64_t lastBeatNs = 0;
    uint64_t sectionSeq = 0;
    int64_t sectionStartNs = 0;
    std::string section;
    std::string collective;
    int64_t collectiveStartNs = 0;
    bool waiting = false;  // markWaiting()
  };
  const HangOptions& options_;
  LearnedTimeouts* learned_;
  std::vector<Rank> ranks_;
};

std::string humanSeconds(std::chrono::milliseconds d);  // "5.2s", "250ms"

}  // namespace drun::agent::detail

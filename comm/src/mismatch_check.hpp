// MismatchCheck: whether the ranks of a communicator were asked for the same collectives. Each
// collective has a fingerprint (op, dtype, count, root, reduce op); ranks compare them through
// an all_gather of their own, before the collective runs. Modes (CheckMode):
//   Every:   each collective is compared first; a rank that differs is named and nothing runs
//            (DRUN_COMM_CHECK=true: one small all_gather per collective).
//   Sampled: the default. The first kFirstChecked collectives are compared as with Every; after
//            them each fingerprint is folded into a running hash and kept in a ring, and every
//            interval-th collective compares its own fingerprint and the hash of those since the
//            last comparison. Hashes that differ: the ranks exchange their rings and name the
//            first collective where they differ (it ran: its results are wrong). Costs one small
//            all_gather per interval collectives.
//   Off:     nothing is compared.
// A mismatch throws InvalidArgument naming this rank's call and each differing rank's.
//
// Threading: the communicator's collectives run one at a time; so do before() and restart().
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend.hpp"

namespace drun::comm::detail {

enum class CheckMode { Off, Sampled, Every };

struct CheckOptions {
  CheckMode mode = CheckMode::Sampled;
  uint64_t interval = 100;  // Sampled: every interval-th collective after the first ones
};

class MismatchCheck {
 public:
  static constexpr uint64_t kFirstChecked = 16;
  static constexpr uint64_t kMaxInterval = 4096;  // the ring's bound (and the exchange's)
  // The five numbers that say what a collective was asked to do.
  static constexpr size_t kFingerprint = 5;
  // An all_gather of `count` int64 per rank: `mine` from this rank, every rank's into `all`.
  using Gather = std::function<void(const int64_t* mine, int64_t* all, size_t count)>;

  // Throws InvalidArgument for an interval of 0 or past kMaxInterval.
  explicit MismatchCheck(CheckOptions options = {});

  CheckMode mode() const { return options_.mode; }
  const CheckOptions& options() const { return options_; }
  // Before collective `c` of a communicator of `size` ranks, `rank` among them: records it and,
  // when due, compares through `gather`. Throws InvalidArgument on a mismatch.
  void before(const Collective& c, int rank, int size, const Gather& gather);
  // The ranks count again from zero (a new generation of in-process recovery).
  void restart();

 private:
  using Fingerprint = std::array<int64_t, kFingerprint>;
  static Fingerprint fingerprintOf(const Collective& c);
  static std::string describe(const int64_t* f);
  bool due() const;
  // `ring`: the fingerprints since the last comparison, from number ringStart_.
  void compareRings(const std::vector<Fingerprint>& ring, const char* what, int rank, int size,
                    const Gather& gather);

  CheckOptions options_;
  uint64_t seen_ = 0;         // collectives recorded since the start (or restart)
  uint64_t hash_ = 0;         // of the fingerprints in ring_
  uint64_t ringStart_ = 0;    // the number of ring_'s first collective (from 1)
  std::vector<Fingerprint> ring_;  // since the last comparison
};

}  // namespace drun::comm::detail

#include "mismatch_check.hpp"

#include <algorithm>
#include <utility>

namespace drun::comm::detail {

namespace {

// What a comparison exchanges per rank: the collective's fingerprint, then the hash of the
// fingerprints since the last comparison.
constexpr size_t kHashAt = MismatchCheck::kFingerprint;
constexpr size_t kExchanged = MismatchCheck::kFingerprint + 1;
constexpr int64_t kNoEntry = -2;  // a ring's padding in the exchange

uint64_t mix(uint64_t h, uint64_t v) {  // splitmix64's finaliser over the running value
  uint64_t z = h + v + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

MismatchCheck::MismatchCheck(CheckOptions options) : options_(options) {
  if (options_.interval == 0 || options_.interval > kMaxInterval)
    throw InvalidArgument("the mismatch check's interval must be 1.." + std::to_string(kMaxInterval) +
                          ", got " + std::to_string(options_.interval));
}

MismatchCheck::Fingerprint MismatchCheck::fingerprintOf(const Collective& c) {
  const bool typed = c.kind != OpKind::Barrier;
  return {static_cast<int64_t>(c.kind), typed ? static_cast<int64_t>(c.dtype) : -1,
          typed ? static_cast<int64_t>(c.count) : 0, isRooted(c.kind) ? c.root : -1,
          isReduction(c.kind) ? static_cast<int64_t>(c.op) : -1};
}

// A peer's numbers are input: any value names something printable.
std::string MismatchCheck::describe(const int64_t* f) {
  const bool known = f[0] >= 0 && f[0] <= static_cast<int64_t>(OpKind::Barrier);
  std::string d = known ? toString(static_cast<OpKind>(f[0])) : "an unknown collective (" + std::to_string(f[0]) + ")";
  if (f[1] >= 0) d += " of " + std::to_string(f[2]) + " " + toString(static_cast<DType>(f[1]));
  if (f[3] >= 0) d += " root " + std::to_string(f[3]);
  if (f[4] >= 0) d += std::string(" ") + toString(static_cast<ReduceOp>(f[4]));
  return d;
}

bool MismatchCheck::due() const {
  return options_.mode == CheckMode::Every || seen_ <= kFirstChecked || seen_ % options_.interval == 0;
}

void MismatchCheck::restart() {
  seen_ = 0;
  hash_ = 0;
  ring_.clear();
}

void MismatchCheck::before(const Collective& c, int rank, int size, const Gather& gather) {
  if (options_.mode == CheckMode::Off) return;
  ++seen_;
  const Fingerprint mine = fingerprintOf(c);
  if (!due()) {
    if (ring_.empty()) ringStart_ = seen_;
    ring_.push_back(mine);
    for (int64_t v : mine) hash_ = mix(hash_, static_cast<uint64_t>(v));
    return;
  }
  // Whatever this comparison finds, the next one covers the collectives from here on.
  int64_t sent[kExchanged];
  std::copy(mine.begin(), mine.end(), sent);
  sent[kHashAt] = static_cast<int64_t>(std::exchange(hash_, 0));
  const std::vector<Fingerprint> ring = std::exchange(ring_, {});
  std::vector<int64_t> all(kExchanged * static_cast<size_t>(size));
  gather(sent, all.data(), kExchanged);
  const char* what = toString(c.kind);
  std::string differ;
  bool hashes = false;
  for (int r = 0; r < size; ++r) {
    const int64_t* theirs = all.data() + kExchanged * static_cast<size_t>(r);
    if (!std::equal(mine.begin(), mine.end(), theirs))
      differ += "; rank " + std::to_string(r) + " called " + describe(theirs);
    hashes = hashes || theirs[kHashAt] != sent[kHashAt];
  }
  if (!differ.empty())
    throw InvalidArgument(std::string(what) + ": the ranks disagree: rank " + std::to_string(rank) + " called " +
                          describe(mine.data()) + differ);
  // Every rank saw the same hashes: all of them compare their rings now, or none does.
  if (hashes) compareRings(ring, what, rank, size, gather);
}

void MismatchCheck::compareRings(const std::vector<Fingerprint>& ring, const char* what, int rank, int size,
                                 const Gather& gather) {
  const size_t entries = options_.interval;
  std::vector<int64_t> sent(entries * kFingerprint, kNoEntry);
  for (size_t i = 0; i < ring.size() && i < entries; ++i)
    std::copy(ring[i].begin(), ring[i].end(), sent.begin() + static_cast<std::ptrdiff_t>(i * kFingerprint));
  std::vector<int64_t> all(sent.size() * static_cast<size_t>(size));
  gather(sent.data(), all.data(), sent.size());
  for (size_t i = 0; i < entries; ++i) {
    const int64_t* mine = sent.data() + i * kFingerprint;
    std::string differ;
    for (int r = 0; r < size; ++r) {
      const int64_t* theirs = all.data() + (static_cast<size_t>(r) * entries + i) * kFingerprint;
      if (!std::equal(mine, mine + kFingerprint, theirs))
        differ += "; rank " + std::to_string(r) + " called " + (theirs[0] == kNoEntry ? "nothing" : describe(theirs));
    }
    if (!differ.empty())
      throw InvalidArgument(std::string(what) + ": the ranks disagreed on collective #" +
                            std::to_string(ringStart_ + i) + ", which ran (its results are wrong): rank " +
                            std::to_string(rank) + " called " + (mine[0] == kNoEntry ? "nothing" : describe(mine)) +
                            differ);
  }
  // Hashes differ, fingerprints not: cannot be (same binary); say so rather than go on silently.
  throw InvalidArgument(std::string(what) + ": the ranks' collectives since #" + std::to_string(ringStart_) +
                        " differ (their hashes do), but no difference was found");
}

}  // namespace drun::comm::detail

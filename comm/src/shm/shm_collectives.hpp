// ShmCollectives: the nine collectives over a ShmSegment (every rank of the communicator on one
// host). Each step: write into this rank's next half, publish the flag, wait for every rank's
// flag, read the peers' halves. Data written for flag k lives in half k%2 and is read before the
// reader's next publish, so two halves let a rank write the next step while slower ranks still
// read the last one, with one flag round per step and no "done reading" round.
//
// Algorithms by size (bytes B, ranks n, half H):
//   all_reduce/reduce, B <= kOneShotBytes: one step, every rank (reduce: the root) reduces all
//     inputs in rank order (the same bits everywhere).
//   larger: per chunk of min(H, kChunkBytes): inputs, step, each rank reduces its 1/n of the
//     chunk into its next half, step, every rank (reduce: the root) copies the n parts out.
//   broadcast, B <= H: queued (queuedBroadcast), 2 to kMaxQueueDepth broadcasts in flight
//     (about kQueueBytes): the root returns once it published, a reader waits for the root
//     alone; the next operation of another kind first waits until everyone read them.
//   broadcast (larger)/scatter/gather/all_gather/all_to_all/reduce_scatter: one step per chunk.
//   all_gather from kSingleCopyBytes per rank, where process_vm_readv is allowed and every rank
//     has a core: the ranks publish their buffers and read each other's once (one copy instead
//     of two through the segment), then a step keeps every buffer in place until its readers are
//     done. With copyBytes for the segment's copies, the segment is faster below 2 MiB per rank
//     and single copy from there, hence kSingleCopyBytes. all_reduce, reduce_scatter and
//     broadcast have no single-copy form: process_vm_readv copies slower than a memcpy within
//     the cache, and the segment's chunked steps pipeline the ranks' copies; with more ranks
//     than cores single copy is slower at every size. Figures: docs/benchmarks/comm.md.
// Threading: one thread at a time (the front end runs collectives in order).
#pragma once

#include <cstdint>

#include "backend.hpp"
#include "shm/shm_segment.hpp"

namespace drun::comm::detail {

class ShmCollectives {
 public:
  explicit ShmCollectives(ShmSegment& segment);
  void run(const Collective& c);

  static constexpr size_t kOneShotBytes = 64u << 10;
  static constexpr size_t kChunkBytes = 512u << 10;
  static constexpr size_t kSingleCopyBytes = 2u << 20;  // all_gather, per rank (above: why)
  static constexpr uint64_t kMaxQueueDepth = 32;  // queued broadcasts in flight, at most (a power of 2)
  static_assert(kMaxQueueDepth / 2 <= ShmSegment::kStampedSubSlots, "a stamped line per sub-slot");
  static constexpr size_t kQueueBytes = 64u << 10;  // a queue's bytes in flight, about (cache)

 private:
  // `wrote`: the bytes this rank wrote at the start of next() for it (what a queued broadcast
  // in that half must not overwrite before every rank read it).
  // `stamped`: the data is in this rank's stamped line (nextLine()), and the wait reads the
  // peers' stamps first (ShmSegment::stampedLine).
  void step(const OpDeadline& deadline, const char* what, size_t wrote, bool stamped = false);
  char* next() const { return seg_.half(seg_.rank(), seq_ + 1); }  // to write before step()
  const char* last(int r) const { return seg_.half(r, seq_); }      // to read after step()
  char* nextLine() const { return seg_.stampedLine(seg_.rank(), seq_ + 1); }  // next(), stamped
  const char* lastLine(int r) const { return seg_.stampedLine(r, seq_); }     // last(r), stamped
  // Elements per chunk when each step moves `blocks` blocks of `es`-byte elements per rank.
  size_t chunkElements(size_t count, size_t es, size_t blocks, bool cache) const;

  // Queued broadcasts: how deep a queue of `bytes` broadcasts is (0: too large to queue), and
  // the sub-slot of a queue of that depth. (Sub-slots packed into consecutive cache lines are no
  // faster than these spaced ones once their pages are mapped, and a change of message size
  // would then move the sub-slots, so it would have to wait as a change of depth does.)
  uint64_t queueDepth(size_t bytes) const;
  size_t subSlotBytes(uint64_t depth) const { return seg_.halfBytes() / (depth / 2); }
  void queuedBroadcast(const Collective& c, uint64_t depth, const OpDeadline& d);
  void singleCopyAllGather(const Collective& c, const OpDeadline& d);

  void reduceAll(const Collective& c, bool toAll, const OpDeadline& d);
  void broadcast(const Collective& c, const OpDeadline& d);
  void blocks(const Collective& c, const OpDeadline& d);  // scatter, gather, all_gather, all_to_all, reduce_scatter

  ShmSegment& seg_;
  uint64_t seq_ = 0;  // this rank's flag: steps done
  bool lagging_ = false;  // queued broadcasts since the last step every rank waited for
  uint64_t queueDepth_ = 0;  // the depth of those
  // Per half: the flag value every rank has published once it read the generic steps' data
  // there (a step's data is read before its reader's next publish).
  uint64_t readersDone_[2] = {0, 0};
  // Per half: how many bytes that step wrote there (from the half's start). A barrier or a
  // single-copy step writes none: the queued broadcasts after it need not wait for its readers
  // (that wait, for readers not running yet, costs a queue of 8-byte broadcasts a context switch
  // after every barrier where the ranks outnumber the cores).
  size_t stepBytes_[2] = {0, 0};
};

}  // namespace drun::comm::detail

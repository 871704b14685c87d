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
//   broadcast/scatter/gather/all_gather/all_to_all/reduce_scatter: one step per chunk; a
//     one-chunk broadcast does not wait for every rank (the root returns once it published, the
//     others wait for the root only): the next operation waits for them first.
//   From kSingleCopyBytes, where process_vm_readv is allowed: all_reduce reads its 1/n of every
//   peer's buffer (staged in kStageBytes pieces) and reduces it in place, step, then reads the
//   other parts from their owners; all_gather, broadcast and reduce_scatter read the peers'
//   buffers once. Two or three steps in all; the last one keeps every buffer in place until
//   every reader is done.
// Threading: one thread at a time (the front end runs collectives in order).
#pragma once

#include <cstdint>
#include <vector>

#include "backend.hpp"
#include "shm/shm_segment.hpp"

namespace drun::comm::detail {

class ShmCollectives {
 public:
  explicit ShmCollectives(ShmSegment& segment) : seg_(segment) {}
  void run(const Collective& c);

  static constexpr size_t kOneShotBytes = 64u << 10;
  static constexpr size_t kChunkBytes = 512u << 10;
  // From here (bytes per rank) all_reduce, all_gather, broadcast and reduce_scatter copy once,
  // straight from the peers' buffers (process_vm_readv), where the segment's probe allowed it.
  static constexpr size_t kSingleCopyBytes = 256u << 10;
  static constexpr size_t kStageBytes = 64u << 10;  // a peer's part staged for a reduction

 private:
  void step(const Deadline& deadline, const char* what);
  char* next() const { return seg_.half(seg_.rank(), seq_ + 1); }  // to write before step()
  const char* last(int r) const { return seg_.half(r, seq_); }      // to read after step()
  // Elements per chunk when each step moves `blocks` blocks of `es`-byte elements per rank.
  size_t chunkElements(size_t count, size_t es, size_t blocks, bool cache) const;

  // Single copy (shm_single_copy.cpp): step (buffers published), read the peers' buffers,
  // step (nobody reads mine any more). False when `c` has no single-copy form.
  bool singleCopy(const Collective& c, const Deadline& d);
  void singleCopyAllReduce(const Collective& c, const Deadline& d);
  void singleCopyReduceScatter(const Collective& c, const Deadline& d);
  template <class PeerAddress>
  void reducePeers(const Collective& c, char* out, size_t count, PeerAddress&& peerAddress);

  void reduceAll(const Collective& c, bool toAll, const Deadline& d);
  void broadcast(const Collective& c, const Deadline& d);
  void blocks(const Collective& c, const Deadline& d);  // scatter, gather, all_gather, all_to_all, reduce_scatter

  ShmSegment& seg_;
  uint64_t seq_ = 0;  // this rank's flag: steps done
  bool lagging_ = false;  // the last step did not wait for every rank (a one-chunk broadcast)
  std::vector<char> stage_;
};

}  // namespace drun::comm::detail

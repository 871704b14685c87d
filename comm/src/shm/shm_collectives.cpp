#include "shm/shm_collectives.hpp"
#include "shm/shm_copy.hpp"

#include <algorithm>
#include <cstring>

#include "reduce.hpp"

namespace drun::comm::detail {

// Every sub-slot a queued broadcast of up to a page starts in, in every rank's halves, is mapped
// now (the sub-slots of shallower queues are among the deepest one's): a first touch is a page
// fault in the middle of a loop of small broadcasts, several times an 8-byte broadcast's cost
// (docs/benchmarks/comm.md). Only these pages (32 per rank): mapping whole slots would make
// every communicator's segment resident.
ShmCollectives::ShmCollectives(ShmSegment& segment) : seg_(segment) {
  for (int r = 0; r < seg_.size(); ++r)
    for (uint64_t h = 0; h < 2; ++h) {
      for (uint64_t j = 0; j < kMaxQueueDepth / 2; ++j)
        seg_.prefault(seg_.half(r, h) + j * subSlotBytes(kMaxQueueDepth));
      seg_.prefault(seg_.stampedLine(r, h));
    }
}

void ShmCollectives::step(const OpDeadline& deadline, const char* what, size_t wrote, bool stamped) {
  ++seq_;
  readersDone_[seq_ & 1] = seq_ + 1;  // a rank publishes seq_ + 1 only after it read this step
  stepBytes_[seq_ & 1] = wrote;
  if (stamped) ShmSegment::stamp(seg_.stampedLine(seg_.rank(), seq_), seq_);
  seg_.publish(seq_);
  seg_.waitAll(seq_, deadline, what, -1, stamped ? 0 : ShmSegment::kNoStamp);
}

size_t ShmCollectives::chunkElements(size_t count, size_t es, size_t blocks, bool cache) const {
  size_t room = seg_.halfBytes() / blocks;
  if (cache) room = std::min(room, kChunkBytes);
  return std::max<size_t>(1, std::min(count, room / es));
}

void ShmCollectives::run(const Collective& c) {
  const OpDeadline deadline(c.timeout);
  const uint64_t depth = c.kind == OpKind::Broadcast ? queueDepth(c.count * dtypeSize(c.dtype)) : 0;
  if (lagging_ && depth == 0) {  // queued broadcasts may still be read: everyone read them now
    seg_.waitAll(seq_, deadline, toString(c.kind));
    lagging_ = false;
  }
  if (depth > 0) return queuedBroadcast(c, depth, deadline);
  if (c.kind == OpKind::AllGather && seg_.singleCopy() && seg_.size() > 1 && seg_.ranksHaveCores() &&
      c.count * dtypeSize(c.dtype) >= kSingleCopyBytes)
    return singleCopyAllGather(c, deadline);
  switch (c.kind) {
    case OpKind::Barrier: return step(deadline, "barrier", 0);
    case OpKind::AllReduce: return reduceAll(c, true, deadline);
    case OpKind::Reduce: return reduceAll(c, false, deadline);
    case OpKind::Broadcast: return broadcast(c, deadline);
    default: return blocks(c, deadline);
  }
}

// all_reduce (toAll) and reduce (the root only); in place in c.recv.
void ShmCollectives::reduceAll(const Collective& c, bool toAll, const OpDeadline& d) {
  const int n = seg_.size(), me = seg_.rank();
  const char* what = toString(c.kind);
  const size_t es = dtypeSize(c.dtype);
  char* buf = static_cast<char*>(c.recv);
  const bool receives = toAll || me == c.root;
  const ReduceFn fn = reduceFunction(c.dtype, c.op);
  const size_t bytes = c.count * es;
  // The data in the stamped lines: only ever one step (the one-shot path below).
  const bool tiny = bytes <= ShmSegment::kStampedPayload;
  auto from = [&](int r) { return tiny ? lastLine(r) : last(r); };
  auto reduceFrom = [&](char* out, size_t offset, size_t elems) {  // out = op over every rank's last half
    if (n == 1) {
      if (out != from(0) + offset) copyBytes(out, from(0) + offset, elems * es);
      return;
    }
    fn(out, from(0) + offset, from(1) + offset, elems);
    for (int r = 2; r < n; ++r) fn(out, out, from(r) + offset, elems);
  };
  if (n == 1) {
    // nothing to combine; AVG of one rank is the value itself
  } else if (bytes <= kOneShotBytes && bytes <= seg_.halfBytes()) {
    copyBytes(tiny ? nextLine() : next(), buf, bytes);
    step(d, what, bytes, tiny);
    if (receives) reduceFrom(buf, 0, c.count);
  } else {
    const size_t chunk = chunkElements(c.count, es, 1, true);
    for (size_t off = 0; off < c.count; off += chunk) {
      const size_t m = std::min(chunk, c.count - off);
      copyBytes(next(), buf + off * es, m * es);
      step(d, what, m * es);
      const size_t lo = m * static_cast<size_t>(me) / n, hi = m * static_cast<size_t>(me + 1) / n;
      char* part = next();  // my part of the result, at its place in the chunk
      if (hi > lo) reduceFrom(part + lo * es, lo * es, hi - lo);
      step(d, what, m * es);
      if (!receives) continue;
      for (int r = 0; r < n; ++r) {
        const size_t rlo = m * static_cast<size_t>(r) / n, rhi = m * static_cast<size_t>(r + 1) / n;
        copyBytes(buf + (off + rlo) * es, last(r) + rlo * es, (rhi - rlo) * es);
      }
    }
  }
  if (c.op == ReduceOp::Avg && receives) divideInPlace(buf, c.count, c.dtype, n);
}

// Broadcast k (this rank's flag value) lives in the root's half k%2, in sub-slot (k/2) % (D/2)
// of D: the data of flag k stays in half k%2 as every other step's, and a sub-slot comes back D
// broadcasts later. The root waits only until every rank read what its sub-slot held (and what
// the generic steps left in that half: readersDone_), so a loop of broadcasts runs up to D ahead
// of its slowest reader, as an eager MPI_Bcast does. A reader waits for the root alone and
// publishes k once it has read: a reader's flag value k means broadcast k is read.
// D (queueDepth) keeps the queue's bytes about cache-sized: deep for small messages, 2 for large
// ones (a deep queue of large broadcasts misses the cache on every copy). A
// change of D first waits until every queued broadcast is read (the sub-slots move).
void ShmCollectives::queuedBroadcast(const Collective& c, uint64_t depth, const OpDeadline& d) {
  const size_t bytes = c.count * dtypeSize(c.dtype);
  if (lagging_ && depth != queueDepth_) seg_.waitAll(seq_, d, "broadcast");
  queueDepth_ = depth;
  lagging_ = true;
  const uint64_t k = ++seq_;
  const size_t sub = (k >> 1) % (depth / 2), offset = sub * subSlotBytes(depth);
  // A broadcast that fits goes in the sub-slot's stamped line (the generic steps' stamped data
  // is in sub-slot 0's, as theirs is at offset 0 of the half: the same overlap as below).
  const bool tiny = bytes <= ShmSegment::kStampedPayload;
  char* data = tiny ? seg_.stampedLine(c.root, k, sub) : seg_.half(c.root, k) + offset;
  if (seg_.rank() == c.root) {
    const uint64_t reused = k > depth ? k - depth : 0;
    // The last step's data in this half (at its start) matters only where this sub-slot overlaps it.
    const uint64_t free = std::max(reused, offset < stepBytes_[k & 1] ? readersDone_[k & 1] : 0);
    if (free > 0) seg_.waitAll(free, d, "broadcast");
    copyBytes(data, c.recv, bytes);
    if (tiny) ShmSegment::stamp(data, k);
    seg_.publish(k);
    return;
  }
  seg_.waitAll(k, d, "broadcast", c.root, tiny ? sub : ShmSegment::kNoStamp);
  copyBytes(c.recv, data, bytes);
  seg_.publish(k);
}

uint64_t ShmCollectives::queueDepth(size_t bytes) const {
  uint64_t depth = kMaxQueueDepth;
  while (depth > 2 && (depth * std::max<size_t>(bytes, 1) > kQueueBytes || bytes > subSlotBytes(depth))) depth /= 2;
  return bytes <= subSlotBytes(depth) ? depth : 0;
}

void ShmCollectives::broadcast(const Collective& c, const OpDeadline& d) {
  const size_t es = dtypeSize(c.dtype);
  char* buf = static_cast<char*>(c.recv);
  const size_t chunk = chunkElements(c.count, es, 1, true);
  const bool root = seg_.rank() == c.root;
  for (size_t off = 0; off < c.count; off += chunk) {
    const size_t m = std::min(chunk, c.count - off);
    if (root) copyBytes(next(), buf + off * es, m * es);
    step(d, "broadcast", root ? m * es : 0);
    if (!root) copyBytes(buf + off * es, last(c.root), m * es);
  }
}

// The block-structured ops: per chunk of m elements of each rank's count, one step.
void ShmCollectives::blocks(const Collective& c, const OpDeadline& d) {
  const int n = seg_.size(), me = seg_.rank();
  const size_t es = dtypeSize(c.dtype), count = c.count;
  const char* what = toString(c.kind);
  const char* send = static_cast<const char*>(c.send);
  char* recv = static_cast<char*>(c.recv);
  const bool root = me == c.root;
  // all_gather and gather in place (my input is my block of the output): mine stays where it is.
  // Compared as integers: a gather's non-root may pass no output at all (no pointer arithmetic).
  const bool inPlace = recv != nullptr && reinterpret_cast<uintptr_t>(send) ==
                                              reinterpret_cast<uintptr_t>(recv) + static_cast<size_t>(me) * count * es;
  // Per rank and step: n blocks (scatter's root, all_to_all, reduce_scatter) or one.
  const bool nBlocks = c.kind == OpKind::Scatter || c.kind == OpKind::AllToAll || c.kind == OpKind::ReduceScatter;
  const size_t chunk = chunkElements(count, es, nBlocks ? static_cast<size_t>(n) : 1, false);
  const ReduceFn fn = c.kind == OpKind::ReduceScatter ? reduceFunction(c.dtype, c.op) : nullptr;
  // One step whose data fits a stamped line: there (next()/last() below are those lines).
  const bool tiny = count * es * (nBlocks ? static_cast<size_t>(n) : 1) <= ShmSegment::kStampedPayload;
  auto next = [&] { return tiny ? nextLine() : this->next(); };
  auto last = [&](int r) { return tiny ? lastLine(r) : this->last(r); };
  for (size_t off = 0; off < count; off += chunk) {
    const size_t m = std::min(chunk, count - off), mb = m * es;
    // Write: block j's chunk at j*mb (n blocks), or this rank's chunk at 0.
    if (nBlocks) {
      // reduce_scatter: my own block is read from my input below; only the peers' go through
      if (c.kind != OpKind::Scatter || root)
        for (int j = 0; j < n; ++j)
          if (c.kind != OpKind::ReduceScatter || j != me) copyBytes(next() + j * mb, send + (j * count + off) * es, mb);
    } else {
      copyBytes(next(), send + off * es, mb);
    }
    step(d, what, nBlocks ? n * mb : mb, tiny);
    switch (c.kind) {
      case OpKind::Scatter:
        copyBytes(recv + off * es, last(c.root) + me * mb, mb);
        break;
      case OpKind::Gather:
        if (!root) break;
        [[fallthrough]];
      case OpKind::AllGather:
        for (int r = 0; r < n; ++r)
          if (r != me || !inPlace) copyBytes(recv + (r * count + off) * es, last(r), mb);
        break;
      case OpKind::AllToAll:
        for (int r = 0; r < n; ++r) copyBytes(recv + (r * count + off) * es, last(r) + me * mb, mb);
        break;
      case OpKind::ReduceScatter: {
        // every rank's chunk of my block, in rank order (the same bits wherever it is read from)
        auto from = [&](int r) { return r == me ? send + (me * count + off) * es : last(r) + me * mb; };
        char* out = recv + off * es;
        if (n == 1) {
          if (out != from(0)) std::memmove(out, from(0), mb);
          break;
        }
        fn(out, from(0), from(1), m);
        for (int r = 2; r < n; ++r) fn(out, out, from(r), m);
        break;
      }
      default:
        break;
    }
  }
  if (c.kind == OpKind::ReduceScatter && c.op == ReduceOp::Avg) divideInPlace(recv, count, c.dtype, n);
}

}  // namespace drun::comm::detail

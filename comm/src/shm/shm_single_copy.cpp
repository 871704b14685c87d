// ShmCollectives' single-copy forms: the ranks publish their buffers' addresses with a step and
// read each other's memory with process_vm_readv (one copy instead of two through the segment).
#include <algorithm>
#include <cstring>

#include "reduce.hpp"
#include "shm/shm_collectives.hpp"

namespace drun::comm::detail {

bool ShmCollectives::singleCopy(const Collective& c, const Deadline& d) {
  const int n = seg_.size(), me = seg_.rank();
  const size_t es = dtypeSize(c.dtype), block = c.count * es;
  const char* what = toString(c.kind);
  switch (c.kind) {
    case OpKind::AllReduce:
      singleCopyAllReduce(c, d);
      return true;
    case OpKind::ReduceScatter:
      singleCopyReduceScatter(c, d);
      return true;
    case OpKind::AllGather: {
      seg_.publishBuffers(c.send, c.recv);
      step(d, what);
      char* recv = static_cast<char*>(c.recv);
      for (int r = 0; r < n; ++r) {
        if (r == me) std::memcpy(recv + r * block, c.send, block);
        else seg_.readPeer(r, seg_.sendAddr(r), recv + r * block, block);
      }
      step(d, what);
      return true;
    }
    case OpKind::Broadcast:
      seg_.publishBuffers(nullptr, c.recv);
      step(d, what);
      if (me != c.root) seg_.readPeer(c.root, seg_.recvAddr(c.root), c.recv, block);
      step(d, what);
      return true;
    default:
      return false;
  }
}

// out[0..count) = out op each peer's `count` elements at peerAddress(r), in rank order, staged
// through stage_ in kStageBytes pieces (a piece stays in cache between its read and its use).
template <class PeerAddress>
void ShmCollectives::reducePeers(const Collective& c, char* out, size_t count, PeerAddress&& peerAddress) {
  const size_t es = dtypeSize(c.dtype), stage = std::max<size_t>(1, kStageBytes / es);
  const ReduceFn fn = reduceFunction(c.dtype, c.op);
  stage_.resize(kStageBytes);
  for (size_t off = 0; off < count; off += stage) {
    const size_t m = std::min(stage, count - off);
    for (int r = 0; r < seg_.size(); ++r) {
      if (r == seg_.rank()) continue;
      seg_.readPeer(r, peerAddress(r) + off * es, stage_.data(), m * es);
      fn(out + off * es, out + off * es, stage_.data(), m);
    }
  }
}

// Rank r owns elements [count*r/n, count*(r+1)/n): it reduces that part of every buffer into its
// own (its own value first, then the peers' in rank order), then everyone reads the owners' parts.
void ShmCollectives::singleCopyAllReduce(const Collective& c, const Deadline& d) {
  const int n = seg_.size(), me = seg_.rank();
  const size_t es = dtypeSize(c.dtype);
  const char* what = "all_reduce";
  char* buf = static_cast<char*>(c.recv);
  auto lo = [&](int r) { return c.count * static_cast<size_t>(r) / n; };
  seg_.publishBuffers(nullptr, buf);
  step(d, what);
  reducePeers(c, buf + lo(me) * es, lo(me + 1) - lo(me), [&](int r) { return seg_.recvAddr(r) + lo(me) * es; });
  step(d, what);
  for (int r = 0; r < n; ++r)
    if (r != me) seg_.readPeer(r, seg_.recvAddr(r) + lo(r) * es, buf + lo(r) * es, (lo(r + 1) - lo(r)) * es);
  step(d, what);
  if (c.op == ReduceOp::Avg) divideInPlace(buf, c.count, c.dtype, n);
}

void ShmCollectives::singleCopyReduceScatter(const Collective& c, const Deadline& d) {
  const int n = seg_.size(), me = seg_.rank();
  const size_t es = dtypeSize(c.dtype);
  const char* what = "reduce_scatter";
  char* recv = static_cast<char*>(c.recv);
  const size_t mine = static_cast<size_t>(me) * c.count * es;  // my block in every send buffer
  seg_.publishBuffers(c.send, c.recv);
  step(d, what);
  std::memcpy(recv, static_cast<const char*>(c.send) + mine, c.count * es);
  reducePeers(c, recv, c.count, [&](int r) { return seg_.sendAddr(r) + mine; });
  step(d, what);
  if (c.op == ReduceOp::Avg) divideInPlace(recv, c.count, c.dtype, n);
}

}  // namespace drun::comm::detail

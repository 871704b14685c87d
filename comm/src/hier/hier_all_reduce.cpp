#include <algorithm>
#include <optional>

#include "hier/hier_backend_impl.hpp"
#include "reduce.hpp"
#include "shm/shm_copy.hpp"

namespace drun::comm::detail {

// Large, hosts of equal size L: shm reduce_scatter (each local rank holds 1/L of the host's
// sum), an all_reduce of that part among the ranks of the same local index (PeerAllReduce), shm all_gather;
// what does not divide by L takes the leaders' path.
void HierBackend::allReduce(const Collective& c, const StepTimeout& sub) {
  const size_t es = dtypeSize(c.dtype);
  const size_t parts = local_ && localPeers_ > 1 && c.count * es >= kSplitBytes ? static_cast<size_t>(localPeers_) : 0;
  const size_t part = parts ? c.count / parts : 0;
  Collective s = c;
  if (s.op == ReduceOp::Avg) s.op = ReduceOp::Sum;  // divided once, by the whole size, at the end
  if (part > 0) {
    // in place: my part of the buffer holds the host's sum, then everyone's, then all parts
    char* mine = static_cast<char*>(c.recv) + static_cast<size_t>(localRank_) * part * es;
    PeerAllReduce across = beginPeerAllReduce(mine, part, c.dtype, sub(s).timeout);  // its receives first
    s.kind = OpKind::ReduceScatter;
    s.send = c.recv;
    s.recv = mine;
    s.count = part;
    local_->run(sub(s));
    finishPeerAllReduce(across, s.op, sub(s).timeout);
    s.kind = OpKind::AllGather;
    s.send = mine;
    s.recv = c.recv;
    local_->run(sub(s));
    s = c;
    if (s.op == ReduceOp::Avg) s.op = ReduceOp::Sum;
    s.recv = static_cast<char*>(c.recv) + part * parts * es;
    s.count = c.count - part * parts;
  }
  if (s.count > 0) leaderAllReduce(s, sub);
  if (c.op == ReduceOp::Avg) divideInPlace(c.recv, c.count, c.dtype, size_);
}

void HierBackend::leaderAllReduce(Collective s, const StepTimeout& sub) {
  std::optional<PeerAllReduce> across;
  if (leaders_) across = beginPeerAllReduce(s.recv, s.count, s.dtype, sub(s).timeout);
  s.kind = OpKind::Reduce;
  s.root = 0;
  if (local_) local_->run(sub(s));
  if (leaders_) finishPeerAllReduce(*across, s.op, sub(s).timeout);
  s.kind = OpKind::Broadcast;
  if (local_) local_->run(sub(s));
}

HierBackend::PeerAllReduce HierBackend::beginPeerAllReduce(void* buf, size_t count, DType dtype, milliseconds timeout) {
  PeerAllReduce r;
  r.buf = static_cast<char*>(buf);
  r.count = count;
  r.es = dtypeSize(dtype);
  r.dtype = dtype;
  const auto hosts = members_.size(), me = static_cast<size_t>(myHost_);
  const size_t myChunk = chunkBegin(count, me + 1) - chunkBegin(count, me);
  char* incoming = r.incoming = scratch(1, hosts * myChunk * r.es);
  for (size_t h = 0; h < hosts; ++h) {
    if (h == me) continue;
    if (myChunk > 0) {
      r.sums.requests.push_back(lane(static_cast<int>(h), myHost_).irecv(incoming + h * myChunk * r.es, myChunk * r.es,
                                                                         static_cast<int>(h), kPeerTag, timeout));
    }
    const size_t begin = chunkBegin(count, h), n = chunkBegin(count, h + 1) - begin;
    if (n > 0)
      r.results.requests.push_back(lane(static_cast<int>(h), myHost_).irecv(r.buf + begin * r.es, n * r.es,
                                                                            static_cast<int>(h), kPeerTag, timeout));
  }
  return r;
}

void HierBackend::finishPeerAllReduce(PeerAllReduce& r, ReduceOp op, milliseconds timeout) {
  const Deadline deadline(timeout);
  auto left = [&] { return std::max(deadline.remaining(), milliseconds(1)); };
  const auto hosts = members_.size(), me = static_cast<size_t>(myHost_);
  for (size_t h = 0; h < hosts; ++h) {
    const size_t begin = chunkBegin(r.count, h), n = chunkBegin(r.count, h + 1) - begin;
    if (h != me && n > 0)
      r.sums.requests.push_back(lane(myHost_, static_cast<int>(h)).isend(r.buf + begin * r.es, n * r.es, static_cast<int>(h), kPeerTag, left()));
  }
  r.sums.wait(left());
  const size_t myBegin = chunkBegin(r.count, me), myChunk = chunkBegin(r.count, me + 1) - myBegin;
  if (myChunk > 0 && hosts > 1) {
    // summed in host order: my own value goes into its host's (unused) slot unless it is first
    const ReduceFn fn = reduceFunction(r.dtype, op);
    const size_t bytes = myChunk * r.es;
    char* mine = r.buf + myBegin * r.es;
    auto slot = [&](size_t h) -> const char* { return h == 0 && me == 0 ? mine : r.incoming + h * bytes; };
    if (me != 0) copyBytes(r.incoming + me * bytes, mine, bytes);
    fn(mine, slot(0), slot(1), myChunk);
    for (size_t h = 2; h < hosts; ++h) fn(mine, mine, slot(h), myChunk);
  }
  PeerExchange sends;
  for (size_t h = 0; h < hosts; ++h)
    if (h != me && myChunk > 0)
      sends.requests.push_back(lane(myHost_, static_cast<int>(h)).isend(r.buf + myBegin * r.es, myChunk * r.es, static_cast<int>(h), kPeerTag, left()));
  r.results.wait(left());
  sends.wait(left());
}

}  // namespace drun::comm::detail

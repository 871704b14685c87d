#include <algorithm>

#include "hier/hier_backend_impl.hpp"

namespace drun::comm::detail {

void HierBackend::broadcast(const Collective& c, const StepTimeout& sub) {
  const int rootHost = hostOf_[static_cast<size_t>(c.root)];
  const auto& rootMembers = members_[static_cast<size_t>(rootHost)];
  const int rootLocal = static_cast<int>(std::find(rootMembers.begin(), rootMembers.end(), c.root) - rootMembers.begin());
  Collective s = c;
  if (members_.size() == 2 && local_ && localPeers_ > 1 && c.count * dtypeSize(c.dtype) >= kSplitBroadcastBytes)
    return twoHostBroadcast(c, rootHost, rootLocal, sub);
  // The root's host first: everyone there (its leader included) gets it from the root. The
  // other hosts' ranks get it from their leaders below.
  if (myHost_ == rootHost && local_) {
    s.root = rootLocal;
    local_->run(sub(s));
  }
  if (leaders_) {
    s.root = rootHost;
    leaders_->run(sub(s));
  }
  if (myHost_ != rootHost && local_) {
    s.root = 0;
    local_->run(sub(s));
  }
}

// Large, two hosts of equal size: the root sends the data in pieces to the rank of its local
// index on the other host (Gloo point to point on the lane) while its own host's ranks get it
// over shm; on the other host each piece goes round over shm as it arrives, while the next is
// on the wire. The leaders' path ran the three steps one after another, one core busy in two.
void HierBackend::twoHostBroadcast(const Collective& c, int rootHost, int rootLocal, const StepTimeout& sub) {
  const size_t es = dtypeSize(c.dtype), pieces = std::clamp<size_t>(c.count * es / kBroadcastPieceBytes, 1, kMaxBroadcastPieces);
  const size_t piece = (c.count + pieces - 1) / pieces;
  char* buf = static_cast<char*>(c.recv);
  const int other = 1 - rootHost;
  Collective s = c;
  s.root = rootLocal;
  if (myHost_ == rootHost) {
    PeerExchange sends;
    if (localRank_ == rootLocal)
      for (size_t off = 0; off < c.count; off += piece)
        sends.requests.push_back(lane(myHost_, other).isend(buf + off * es, std::min(piece, c.count - off) * es, other, kPeerTag, sub(s).timeout));
    local_->run(sub(s));
    sends.wait(sub(s).timeout);
    return;
  }
  PeerExchange receives;
  if (localRank_ == rootLocal)
    for (size_t off = 0; off < c.count; off += piece)
      receives.requests.push_back(lane(rootHost, myHost_).irecv(buf + off * es, std::min(piece, c.count - off) * es, rootHost, kPeerTag, sub(s).timeout));
  for (size_t i = 0, off = 0; off < c.count; ++i, off += piece) {
    if (localRank_ == rootLocal) receives.requests[i]->wait(sub(s).timeout);
    s.recv = buf + off * es;
    s.count = std::min(piece, c.count - off);
    local_->run(sub(s));
  }
}

}  // namespace drun::comm::detail

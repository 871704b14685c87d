#include <algorithm>
#include <vector>

#include "hier/hier_backend_impl.hpp"
#include "reduce.hpp"
#include "shm/shm_copy.hpp"

namespace drun::comm::detail {

// The host's sum reaches its leader (shm), the leaders reduce to the root's host (Gloo), and
// that host's leader hands it to the root (shm point to point) when the root is not the
// leader. The leaders work in a copy: reduce leaves the buffers of ranks other than the root.
void HierBackend::reduce(const Collective& c, const StepTimeout& sub) {
  const size_t bytes = c.count * dtypeSize(c.dtype);
  const int rootHost = hostOf_[static_cast<size_t>(c.root)];
  const auto& rootMembers = members_[static_cast<size_t>(rootHost)];
  const int rootLocal = static_cast<int>(std::find(rootMembers.begin(), rootMembers.end(), c.root) - rootMembers.begin());
  const bool iAmRoot = myHost_ == rootHost && localRank_ == rootLocal;
  std::vector<char> scratch;
  char* work = static_cast<char*>(c.recv);
  if (localRank_ == 0 && !iAmRoot) {
    scratch.assign(work, work + bytes);
    work = scratch.data();
  }
  Collective s = c;
  if (s.op == ReduceOp::Avg) s.op = ReduceOp::Sum;  // divided once, by the whole size, by the root
  s.kind = OpKind::Reduce;
  s.root = 0;
  s.recv = localRank_ == 0 ? work : c.recv;
  if (local_) local_->run(sub(s));
  if (leaders_) {
    s.root = rootHost;
    s.recv = work;
    leaders_->run(sub(s));
  }
  if (rootLocal != 0 && myHost_ == rootHost) {
    if (localRank_ == 0)
      local_->isend(work, bytes, rootLocal, kHandOffTag, sub(s).timeout)->wait(sub(s).timeout);
    else if (iAmRoot)
      local_->irecv(c.recv, bytes, 0, kHandOffTag, sub(s).timeout)->wait(sub(s).timeout);
  }
  if (iAmRoot && c.op == ReduceOp::Avg) divideInPlace(c.recv, c.count, c.dtype, size_);
}

// Hosts of equal size L: each host's ranks sum the whole input over shm, local rank i keeping
// the host's sum of the blocks of every host's rank i (one reduce_scatter per host's blocks,
// straight from the input where a host's ranks are consecutive, else from a copy in that
// order); each rank sends the other hosts' sums to their ranks of its local index (Gloo point to
// point on peers_), sums its own host's meanwhile, and adds what it receives. Each rank sends
// (hosts-1) blocks across hosts and none through TCP within one, where the flat Gloo
// reduce_scatter sends (size-1). (Through the leaders, the hosts' whole sums reduced to them
// first, one rank per host would do all the TCP.)
void HierBackend::reduceScatter(const Collective& c, const StepTimeout& sub) {
  const size_t block = c.count * dtypeSize(c.dtype), hosts = members_.size(), L = static_cast<size_t>(localPeers_);
  const auto mine = static_cast<size_t>(myHost_);
  const char* send = static_cast<const char*>(c.send);
  char* recv = static_cast<char*>(c.recv);
  char* hostSums = scratch(0, hosts * block);  // [host]: this host's sum of that host's block of my local index
  char* received = scratch(1, hosts * block);  // [host]: that host's sum of my block
  Collective s = c;
  if (s.op == ReduceOp::Avg) s.op = ReduceOp::Sum;  // divided once, by the whole size, at the end
  // The receives go out first, before the shm work (docs/comm.md "Lanes").
  PeerExchange exchange = receiveFromPeers(block, [&](size_t h) { return received + h * block; }, sub(s).timeout);
  auto post = [&] {
    sendToPeers(exchange, block, [&](size_t h) { return static_cast<const char*>(hostSums + h * block); }, sub(s).timeout);
  };
  const char* own = recv;  // this host's sum of my block
  if (consecutiveHosts_) {
    auto sumHost = [&](size_t h, char* into) {
      s.send = send + static_cast<size_t>(members_[h][0]) * block;
      s.recv = into;
      local_->run(sub(s));
    };
    for (size_t h = 0; h < hosts; ++h)
      if (h != mine) sumHost(h, hostSums + h * block);
    post();
    sumHost(mine, recv);  // while the sums travel
  } else {
    std::vector<char>& ordered = orderedInput_;  // [local index][host]
    if (ordered.size() < static_cast<size_t>(size_) * block) ordered = std::vector<char>(static_cast<size_t>(size_) * block);
    for (size_t i = 0; i < L; ++i)
      for (size_t h = 0; h < hosts; ++h)
        copyBytes(ordered.data() + (i * hosts + h) * block, send + static_cast<size_t>(members_[h][i]) * block, block);
    s.send = ordered.data();
    s.recv = hostSums;
    s.count = c.count * hosts;
    local_->run(sub(s));
    own = hostSums + mine * block;
    post();
  }
  exchange.wait(sub(s).timeout);
  const ReduceFn fn = reduceFunction(c.dtype, s.op);
  for (size_t h = 0; h < hosts; ++h) {
    if (h == mine) continue;
    fn(recv, own, received + h * block, c.count);
    own = recv;
  }
  if (c.op == ReduceOp::Avg) divideInPlace(c.recv, c.count, c.dtype, size_);
}

}  // namespace drun::comm::detail

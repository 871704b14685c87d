#include <algorithm>

#include "hier/hier_backend_impl.hpp"
#include "shm/shm_copy.hpp"

namespace drun::comm::detail {

void HierBackend::allGather(const Collective& c, const StepTimeout& sub) {
  const size_t block = c.count * dtypeSize(c.dtype);
  if (local_ && localPeers_ > 1 && block * static_cast<size_t>(size_) >= kSplitAllGatherBytes)
    return splitAllGather(c, sub);
  size_t widest = 0;
  for (const auto& m : members_) widest = std::max(widest, m.size());
  char* host = scratch(0, widest * block);
  Collective s = c;
  if (local_) {
    s.kind = OpKind::Gather;
    s.root = 0;
    s.recv = host;
    local_->run(sub(s));
  } else {
    copyBytes(host, c.send, block);
  }
  if (leaders_) {
    char* all = scratch(1, members_.size() * widest * block);
    s.kind = OpKind::AllGather;
    s.send = host;
    s.recv = all;
    s.count = widest * c.count;
    leaders_->run(sub(s));
    for (size_t h = 0; h < members_.size(); ++h)
      for (size_t i = 0; i < members_[h].size(); ++i)
        copyBytes(static_cast<char*>(c.recv) + static_cast<size_t>(members_[h][i]) * block,
                    all + (h * widest + i) * block, block);
  }
  if (local_) {
    s = c;
    s.kind = OpKind::Broadcast;
    s.root = 0;
    s.count = c.count * static_cast<size_t>(size_);
    local_->run(sub(s));
  }
}

// Large, hosts of equal size L: every rank sends its block straight from its input to the
// ranks of its local index on the other hosts and receives theirs straight into place (Gloo
// point to point on peers_); meanwhile its host's ranks all_gather their own blocks over shm;
// then each other host's blocks, received, go round the host the same way. Where a host's ranks
// are consecutive (drun's layout) every shm step is in place; else through a copy. Per rank
// (2 x 2, 64 MiB): 16 MiB each way over TCP and 48 MiB of shm reads, where Gloo's all_gather
// among the peers then shm all_gathers from its output copied the own block twice more, and a
// path through the leaders sends everything through one connection per host and broadcasts the
// whole result on each host (both slower: docs/benchmarks/comm.md, "Hierarchical thresholds").
void HierBackend::splitAllGather(const Collective& c, const StepTimeout& sub) {
  const size_t block = c.count * dtypeSize(c.dtype), hosts = members_.size();
  char* recv = static_cast<char*>(c.recv);
  const auto me = static_cast<size_t>(localRank_);
  Collective s = c;
  if (!consecutiveHosts_) {
    char* fromPeers = scratch(0, hosts * block);  // [host]: the block of its rank of my local index
    auto exchange = exchangeWithPeers(
        block, [&](size_t h) { return fromPeers + h * block; }, [&](size_t) { return static_cast<const char*>(c.send); },
        sub(s).timeout);
    copyBytes(fromPeers + static_cast<size_t>(myHost_) * block, c.send, block);
    exchange.wait(sub(s).timeout);
    char* gathered = scratch(1, static_cast<size_t>(size_) * block);  // [local index][host]
    s.send = fromPeers;
    s.recv = gathered;
    s.count = c.count * hosts;
    local_->run(sub(s));
    for (size_t i = 0; i < static_cast<size_t>(localPeers_); ++i)
      for (size_t h = 0; h < hosts; ++h)
        copyBytes(recv + static_cast<size_t>(members_[h][i]) * block, gathered + (i * hosts + h) * block, block);
    return;
  }
  auto slot = [&](size_t h, size_t i) { return recv + static_cast<size_t>(members_[h][i]) * block; };
  auto exchange = exchangeWithPeers(
      block, [&](size_t h) { return slot(h, me); }, [&](size_t) { return static_cast<const char*>(c.send); },
      sub(s).timeout);
  s.recv = slot(static_cast<size_t>(myHost_), 0);
  local_->run(sub(s));
  exchange.wait(sub(s).timeout);
  for (size_t h = 0; h < hosts; ++h) {
    if (h == static_cast<size_t>(myHost_)) continue;
    s.send = slot(h, me);
    s.recv = slot(h, 0);
    local_->run(sub(s));
  }
}

}  // namespace drun::comm::detail

#include "hier/hier_backend.hpp"

#include <algorithm>

#include "drun/store/prefix_store.hpp"
#include "hier/hier_backend_impl.hpp"
#include "shm/shm_backend.hpp"

namespace drun::comm::detail {

HierBackend::HierBackend(std::shared_ptr<rdzv::Store> store, int rank, const std::vector<std::string>& hostOfRank,
                         milliseconds timeout, const ShmOptions& shm, std::shared_ptr<GlooDevice> device)
    : size_(static_cast<int>(hostOfRank.size())) {
  std::vector<std::string> ids;  // hosts in the order of their lowest rank
  for (int r = 0; r < size_; ++r) {
    auto at = std::find(ids.begin(), ids.end(), hostOfRank[static_cast<size_t>(r)]);
    if (at == ids.end()) {
      ids.push_back(hostOfRank[static_cast<size_t>(r)]);
      members_.emplace_back();
      at = ids.end() - 1;
    }
    hostOf_.push_back(static_cast<int>(at - ids.begin()));
    members_[static_cast<size_t>(hostOf_.back())].push_back(r);
  }
  myHost_ = hostOf_[static_cast<size_t>(rank)];
  const auto& mine = members_[static_cast<size_t>(myHost_)];
  localRank_ = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  // The same order on every rank: the full mesh (all), the host's segment, the leaders' mesh.
  full_ = makeGlooBackend(device, std::make_shared<rdzv::PrefixStore>("full/", store), rank, size_, timeout);
  // The host's ranks wait for their leader's TCP work: spinning there would take the CPU the
  // leaders need, so their waits sleep soon.
  ShmOptions hostShm = shm;
  hostShm.busyWait = std::chrono::microseconds(100);
  hostShm.rankNames = mine;  // errors name the communicator's ranks
  if (mine.size() > 1)
    local_ = makeShmBackend(*std::make_shared<rdzv::PrefixStore>("local" + std::to_string(myHost_) + "/", store),
                            localRank_, static_cast<int>(mine.size()), timeout, hostShm);
  // Hosts of equal size: the ranks with the same local index across hosts form a Gloo mesh
  // each (the leaders' is index 0's), so that large all_reduces use every rank's TCP share.
  const bool even = std::all_of(members_.begin(), members_.end(), [&](const auto& m) { return m.size() == mine.size(); });
  if (localRank_ == 0 || even)
    peers_ = makeGlooBackend(device, std::make_shared<rdzv::PrefixStore>("peers" + std::to_string(localRank_) + "/", store),
                             myHost_, static_cast<int>(members_.size()), timeout);
  if (localRank_ == 0) leaders_ = peers_.get();
  // The back lane: messages to lower hosts (lane(), docs/comm.md "Lanes").
  if (peers_)
    peersBack_ = makeGlooBackend(device, std::make_shared<rdzv::PrefixStore>("peersback" + std::to_string(localRank_) + "/", store),
                                 myHost_, static_cast<int>(members_.size()), timeout);
  std::vector<int> localIndex(static_cast<size_t>(size_), -1);
  for (size_t i = 0; i < mine.size(); ++i) localIndex[static_cast<size_t>(mine[i])] = static_cast<int>(i);
  p2p_ = std::make_shared<HierP2P>(local_.get(), *full_, std::move(localIndex));
  if (!even) localPeers_ = 0;
  else localPeers_ = static_cast<int>(mine.size());
  consecutiveHosts_ = std::all_of(members_.begin(), members_.end(), [](const std::vector<int>& m) {
    for (size_t i = 1; i < m.size(); ++i)
      if (m[i] != m[0] + static_cast<int>(i)) return false;
    return true;
  });
}

// p2p_ stops before the backends it uses go.
HierBackend::~HierBackend() { p2p_->stop("the communicator was destroyed"); }

void HierBackend::run(const Collective& c) {
  const StepTimeout sub{Deadline(c.timeout)};
  switch (c.kind) {
    case OpKind::AllReduce: return allReduce(c, sub);
    case OpKind::Broadcast: return broadcast(c, sub);
    case OpKind::AllGather: return allGather(c, sub);
    case OpKind::Reduce: return reduce(c, sub);
    case OpKind::ReduceScatter:
      if (local_ && localPeers_ > 1) return reduceScatter(c, sub);
      return full_->run(c);
    case OpKind::Barrier:
      if (local_) local_->run(sub(c));
      if (leaders_) leaders_->run(sub(c));
      if (local_) local_->run(sub(c));
      return;
    default:
      // gather and scatter are the root's traffic, all_to_all's cross-host bytes are the same
      // either way: a hierarchy would only add copies.
      return full_->run(c);
  }
}

void HierBackend::abort() {
  p2p_->stop(kAbortedAfterFailure);
  if (local_) local_->abort();
  if (peers_) peers_->abort();
  if (peersBack_) peersBack_->abort();
  full_->abort();
}

std::unique_ptr<Backend> makeHierarchicalBackend(std::shared_ptr<rdzv::Store> store, int rank,
                                                 const std::vector<std::string>& hostOfRank,
                                                 milliseconds timeout, const ShmOptions& shm,
                                                 std::shared_ptr<GlooDevice> device) {
  return std::make_unique<HierBackend>(std::move(store), rank, hostOfRank, timeout, shm, std::move(device));
}

}  // namespace drun::comm::detail

#include "hier/hier_backend.hpp"

#include <algorithm>
#include <cstring>
#include <optional>

#include "drun/store/prefix_store.hpp"
#include "hier/hier_p2p.hpp"
#include "reduce.hpp"
#include "shm/shm_backend.hpp"
#include "shm/shm_copy.hpp"

namespace drun::comm::detail {
namespace {

class HierBackend final : public Backend {
 public:
  // all_reduce's per-local-rank split from here: below it the L Gloo all_reduces side by side took
  // ~2 ms where the leaders' one took 0.3-0.4 (2 hosts x 2, 256-512 KiB), as all_gather's below.
  static constexpr size_t kSplitBytes = 1u << 20;
  // all_gather's, in all: below it the L Gloo exchanges side by side took 1-4 ms where the
  // leaders' one took 0.3 (2 hosts x 2, 256 KiB-2 MiB: the 4 ranks' TCP work on 2 cores).
  static constexpr size_t kSplitAllGatherBytes = 4u << 20;
  // broadcast on two hosts: from here through the root's peer, in pieces of about
  // kBroadcastPieceBytes (at most kMaxBroadcastPieces: every Gloo message costs wake-ups).
  static constexpr size_t kSplitBroadcastBytes = 1u << 20;
  static constexpr size_t kBroadcastPieceBytes = 4u << 20;
  static constexpr size_t kMaxBroadcastPieces = 8;

  HierBackend(std::shared_ptr<rdzv::Store> store, int rank, const std::vector<std::string>& hostOfRank,
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

  void run(const Collective& c) override {
    const Deadline deadline(c.timeout);
    auto sub = [&](Collective s) {  // each step gets what is left of the operation's time
      s.timeout = std::max(deadline.remaining(), milliseconds(1));
      return s;
    };
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

  ~HierBackend() override { p2p_->stop("the communicator was destroyed"); }  // before its backends go

  // A peer on this host over the segment, one on another host over the full mesh.
  std::shared_ptr<Request::State> isend(const void* buf, size_t bytes, int dst, int tag, milliseconds timeout) override {
    return p2p_->isend(buf, bytes, dst, tag, timeout);
  }
  std::shared_ptr<Request::State> irecv(void* buf, size_t bytes, int src, int tag, milliseconds timeout) override {
    return p2p_->irecv(buf, bytes, src, tag, timeout);
  }
  std::unique_ptr<Backend> makeGroup(std::shared_ptr<rdzv::Store> store, int rank, int size, milliseconds timeout) override {
    return full_->makeGroup(std::move(store), rank, size, timeout);
  }
  void abort() override {
    p2p_->stop(kAbortedAfterFailure);
    if (local_) local_->abort();
    if (peers_) peers_->abort();
    if (peersBack_) peersBack_->abort();
    full_->abort();
  }
  const char* transport() const override { return "hierarchical"; }

 private:
  // Large, hosts of equal size L: shm reduce_scatter (each local rank holds 1/L of the host's
  // sum), an all_reduce of that part among the ranks of the same local index (PeerAllReduce), shm all_gather;
  // what does not divide by L takes the leaders' path.
  template <class Sub>
  void allReduce(const Collective& c, Sub&& sub) {
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

  template <class Sub>
  void leaderAllReduce(Collective s, Sub&& sub) {
    std::optional<PeerAllReduce> across;
    if (leaders_) across = beginPeerAllReduce(s.recv, s.count, s.dtype, sub(s).timeout);
    s.kind = OpKind::Reduce;
    s.root = 0;
    if (local_) local_->run(sub(s));
    if (leaders_) finishPeerAllReduce(*across, s.op, sub(s).timeout);
    s.kind = OpKind::Broadcast;
    if (local_) local_->run(sub(s));
  }

  template <class Sub>
  void broadcast(const Collective& c, Sub&& sub) {
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
  template <class Sub>
  void twoHostBroadcast(const Collective& c, int rootHost, int rootLocal, Sub&& sub) {
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

  template <class Sub>
  void allGather(const Collective& c, Sub&& sub) {
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
  // among the peers then shm all_gathers from its output copied the own block twice more (1.14-1.2x
  // raw Gloo from 8 MiB). The leaders' path sent everything through one connection per host and
  // broadcast the whole result on each host (0.36-0.9x raw Gloo from 8 MiB).
  template <class Sub>
  void splitAllGather(const Collective& c, Sub&& sub) {
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

  // Hosts of equal size L: each host's ranks sum the whole input over shm, local rank i keeping
  // the host's sum of the blocks of every host's rank i (one reduce_scatter per host's blocks,
  // straight from the input where a host's ranks are consecutive, else from a copy in that
  // order); each rank sends the other hosts' sums to their ranks of its local index (Gloo point to
  // point on peers_), sums its own host's meanwhile, and adds what it receives. Each rank sends
  // (hosts-1) blocks across hosts and none through TCP within one, where the flat Gloo
  // reduce_scatter sends (size-1). (Through the leaders, the hosts' whole sums reduced to them
  // first, measured 0.2-0.7x raw Gloo on 2 hosts x 2: one rank per host did all the TCP.)
  template <class Sub>
  void reduceScatter(const Collective& c, Sub&& sub) {
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

  // The point-to-point requests of one exchange among peers_ (one rank per host, my local index):
  // a receive from and a send to every other host.
  struct PeerExchange {
    std::vector<std::shared_ptr<Request::State>> requests;
    void wait(milliseconds timeout) {
      const Deadline deadline(timeout);
      for (auto& r : requests) r->wait(std::max(deadline.remaining(), milliseconds(1)));
    }
  };

  // Posts every receive before any send: recvAt(h) and sendAt(h) are the `bytes` from and to host h.
  template <class RecvAt, class SendAt>
  PeerExchange exchangeWithPeers(size_t bytes, RecvAt recvAt, SendAt sendAt, milliseconds timeout) {
    PeerExchange exchange = receiveFromPeers(bytes, recvAt, timeout);
    sendToPeers(exchange, bytes, sendAt, timeout);
    return exchange;
  }
  template <class RecvAt>
  PeerExchange receiveFromPeers(size_t bytes, RecvAt recvAt, milliseconds timeout) {
    PeerExchange exchange;
    const auto hosts = static_cast<int>(members_.size());
    for (int h = 0; h < hosts; ++h)
      if (h != myHost_) exchange.requests.push_back(lane(h, myHost_).irecv(recvAt(static_cast<size_t>(h)), bytes, h, kPeerTag, timeout));
    return exchange;
  }
  template <class SendAt>
  void sendToPeers(PeerExchange& exchange, size_t bytes, SendAt sendAt, milliseconds timeout) {
    const auto hosts = static_cast<int>(members_.size());
    for (int h = 0; h < hosts; ++h)
      if (h != myHost_) exchange.requests.push_back(lane(myHost_, h).isend(sendAt(static_cast<size_t>(h)), bytes, h, kPeerTag, timeout));
  }

  // An all_reduce among peers_ (my local index on every host) of `count` elements at `buf`, in
  // place, as two exchanges over the lanes: every host sends chunk h of its data to host h, which
  // sums it (in host order, so every host ends with the same bits), then sends the sum to every
  // host. Both exchanges' receives are posted by begin, before the caller's shm work: a Gloo
  // receive posted while the peer's message arrives on that pair, or a message sent both ways on
  // one pair at once, leaves the pair's lock to one thread while Gloo's device thread spins on
  // epoll for it (measured: 250,000-450,000 epoll_wait calls a second, a core lost, on 2 hosts x 2
  // at 64 KiB); Gloo's own all_reduce between two ranks sends and receives on the one pair. A
  // step-2 receive into chunk h cannot land before my step-1 send of chunk h has left: host h
  // sends its sum only after it got mine.
  struct PeerAllReduce {
    char* buf = nullptr;
    size_t count = 0, es = 0;
    DType dtype{};
    PeerExchange sums;      // step 1's receives: every host's chunk of mine
    PeerExchange results;   // step 2's receives: every other host's summed chunk, into place
    char* incoming = nullptr;  // [host]: that host's value of my chunk (scratch 1)
  };

  size_t chunkBegin(size_t count, size_t h) const { return count * h / members_.size(); }

  PeerAllReduce beginPeerAllReduce(void* buf, size_t count, DType dtype, milliseconds timeout) {
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

  void finishPeerAllReduce(PeerAllReduce& r, ReduceOp op, milliseconds timeout) {
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

  // Scratch buffer `which` (0 or 1) of at least `bytes`, kept between operations: a fresh
  // zero-filled vector per call page-faulted 64 MiB every time.
  char* scratch(int which, size_t bytes) {
    auto& buffer = scratch_[which];
    if (buffer.size() < bytes) buffer = std::vector<char>(bytes);
    return buffer.data();
  }

  // The host's sum reaches its leader (shm), the leaders reduce to the root's host (Gloo), and
  // that host's leader hands it to the root (shm point to point) when the root is not the
  // leader. The leaders work in a copy: reduce leaves the buffers of ranks other than the root.
  template <class Sub>
  void reduce(const Collective& c, Sub&& sub) {
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

  // Point-to-point tag of reduce's hand-off on the host's segment, which users' messages share:
  // negative, a tag no user can give.
  static constexpr int kHandOffTag = -2;
  // peers_ carries no user messages: its exchanges' one tag; messages of a pair match in order.
  static constexpr int kPeerTag = 0;

  int size_;
  std::vector<int> hostOf_;                // per rank: its host's index
  std::vector<std::vector<int>> members_;  // per host: its ranks, ascending
  int myHost_ = 0, localRank_ = 0;
  std::unique_ptr<Backend> full_, local_, peers_, peersBack_;
  // The mesh a message from host `from` to host `to` travels on among the peers: each pair then
  // carries data one way only (docs/comm.md "Lanes").
  Backend& lane(int from, int to) { return from < to ? *peers_ : *peersBack_; }
  Backend* leaders_ = nullptr;  // peers_ of local rank 0
  std::shared_ptr<HierP2P> p2p_;
  int localPeers_ = 0;          // ranks per host when all hosts have as many, else 0
  bool consecutiveHosts_ = false;  // each host's ranks are consecutive numbers
  std::vector<char> scratch_[2];
  std::vector<char> orderedInput_;  // reduce_scatter's input in [local index][host] order
};

}  // namespace

std::unique_ptr<Backend> makeHierarchicalBackend(std::shared_ptr<rdzv::Store> store, int rank,
                                                 const std::vector<std::string>& hostOfRank,
                                                 milliseconds timeout, const ShmOptions& shm,
                                                 std::shared_ptr<GlooDevice> device) {
  return std::make_unique<HierBackend>(std::move(store), rank, hostOfRank, timeout, shm, std::move(device));
}

}  // namespace drun::comm::detail

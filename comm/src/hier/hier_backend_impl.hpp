// HierBackend: the hierarchical backend's class (hier_backend.hpp says what each operation does).
// One file per operation: hier_backend.cpp (construction, dispatch, barrier, point to point),
// hier_all_reduce.cpp (all_reduce and the all_reduce among peers), hier_reduce.cpp (reduce,
// reduce_scatter), hier_broadcast.cpp, hier_all_gather.cpp. Threading and ownership: a Backend's.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "hier/hier_p2p.hpp"
#include "shm/shm_segment.hpp"

namespace drun::comm::detail {

class HierBackend final : public Backend {
 public:
  // all_reduce's per-local-rank split from here: below it the L Gloo all_reduces side by side cost
  // more than the leaders' one (docs/benchmarks/comm.md, "Hierarchical thresholds").
  static constexpr size_t kSplitBytes = 1u << 20;
  // all_gather's, in all: below it the L Gloo exchanges side by side cost more than the leaders'
  // one (the ranks' TCP work shares the cores; docs/benchmarks/comm.md, "Hierarchical thresholds").
  static constexpr size_t kSplitAllGatherBytes = 4u << 20;
  // broadcast on two hosts: from here through the root's peer, in pieces of about
  // kBroadcastPieceBytes (at most kMaxBroadcastPieces: every Gloo message costs wake-ups).
  static constexpr size_t kSplitBroadcastBytes = 1u << 20;
  static constexpr size_t kBroadcastPieceBytes = 4u << 20;
  static constexpr size_t kMaxBroadcastPieces = 8;

  HierBackend(std::shared_ptr<rdzv::Store> store, int rank, const std::vector<std::string>& hostOfRank,
              milliseconds timeout, const ShmOptions& shm, std::shared_ptr<GlooDevice> device);
  ~HierBackend() override;

  void run(const Collective& c) override;

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
  void abort() override;
  const char* transport() const override { return "hierarchical"; }

 private:
  // Each step of an operation gets what is left of the operation's time.
  struct StepTimeout {
    Deadline deadline;
    Collective operator()(Collective s) const {
      s.timeout = std::max(deadline.remaining(), milliseconds(1));
      return s;
    }
  };

  void allReduce(const Collective& c, const StepTimeout& sub);
  void leaderAllReduce(Collective s, const StepTimeout& sub);
  void broadcast(const Collective& c, const StepTimeout& sub);
  void twoHostBroadcast(const Collective& c, int rootHost, int rootLocal, const StepTimeout& sub);
  void allGather(const Collective& c, const StepTimeout& sub);
  void splitAllGather(const Collective& c, const StepTimeout& sub);
  void reduceScatter(const Collective& c, const StepTimeout& sub);
  void reduce(const Collective& c, const StepTimeout& sub);

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
  // epoll for it (a core lost: docs/benchmarks/comm.md, "Hierarchical thresholds"); Gloo's own
  // all_reduce between two ranks sends and receives on the one pair. A
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

  PeerAllReduce beginPeerAllReduce(void* buf, size_t count, DType dtype, milliseconds timeout);
  void finishPeerAllReduce(PeerAllReduce& r, ReduceOp op, milliseconds timeout);

  // Scratch buffer `which` (0 or 1) of at least `bytes`, kept between operations: a fresh
  // zero-filled vector per call page-faulted 64 MiB every time.
  char* scratch(int which, size_t bytes) {
    auto& buffer = scratch_[which];
    if (buffer.size() < bytes) buffer = std::vector<char>(bytes);
    return buffer.data();
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

}  // namespace drun::comm::detail

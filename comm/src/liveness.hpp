// Liveness: how the survivors of a failed operation learn which peer is gone.
//
// At init each rank registers a will on its store connection: when the connection closes
// without a goodbye (the process died), the store sets "gone/<rank>" = "<host> pid <pid>" and adds
// 1 to "gone_count". describeGone() reads those keys after a failure; a store that cannot be
// reached while rank 0 hosts it means rank 0 is gone. disarm() removes the will before an orderly
// exit. Stores without wills (FileStore) give no names, only the transport's error.
// Threading: thread-safe (the store is). Ownership: shares the world's store.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "drun/common/deadline.hpp"
#include "drun/store/store.hpp"

namespace drun::comm::detail {

class Liveness {
 public:
  // store: the world communicator's store (already prefixed).
  Liveness(std::shared_ptr<rdzv::LivenessStore> store, int rank, int worldSize);
  // The store lives in rank 0's process, so losing the store means losing rank 0.
  void setRank0HostsStore(bool value) { rank0HostsStore_ = value; }

  void arm();
  void disarm();
  // "rank 2 (host pid 77) is gone" / "ranks 1, 3 are gone" / "" (none known). Waits up to
  // `grace` for the store to report a death when none is known yet (a peer's sockets and its
  // store connection close at the same moment, but the store may run the will a little later).
  std::string describeGone(milliseconds grace) const;
  int goneCount() const;  // 0 when unknown

 private:
  std::shared_ptr<rdzv::LivenessStore> store_;
  int rank_;
  int worldSize_;
  std::atomic<bool> rank0HostsStore_{false};
  bool armed_ = false;
};

}  // namespace drun::comm::detail

// Heartbeat: names the ranks of a process group that stopped being heard, across hosts. A torch
// Store has no wills (drun's own store names a dead rank at once; a TCPStore cannot), so each rank
// refreshes a key of its own in the group's store and watches the others': a rank whose key did
// not change for `staleAfter` (timed on this rank's steady clock, so hosts' clocks may differ) is
// named when an operation fails: "rank 3 (host h1 node 1) has not been heard for 6 s".
//
// Keys: `drun_heartbeat/<rank>` = "<beat count> <host label>" in the store the group was given
// (torch's PrefixStore per group). Cost per rank and period: one set and world-1 reads.
//
// Threading: one background thread per Heartbeat; explainFailure() from any thread. Every store
// read waits at most `storeDeadline`; a store call that blocks anyway (a c10d set has no deadline)
// delays only this thread. The thread (an OwnedThread: signals blocked) shares what it uses (the
// store included): the destructor tells it to stop and joins it within storeDeadline + period,
// so a thread stuck in a store call is left to end on its own instead of hanging destroy.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

#include "drun/common/owned_thread.hpp"

namespace drun::torch_backend {

struct HeartbeatOptions {
  std::chrono::milliseconds period{1000};
  std::chrono::milliseconds staleAfter{4000};
  std::chrono::milliseconds storeDeadline{3000};
  // Options from DRUN_TORCH_HEARTBEAT_MS (period; 0 turns heartbeats off) and
  // DRUN_TORCH_HEARTBEAT_STALE_MS, else the defaults.
  static HeartbeatOptions fromEnv();
  bool enabled() const { return period.count() > 0; }
};

class Heartbeat {
 public:
  Heartbeat(c10::intrusive_ptr<c10d::Store> store, int rank, int size, HeartbeatOptions options);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // After a failed operation: names every stale rank ("rank 3 (host h) has not been heard for
  // 6 s"); "" if every rank kept beating (the failure is not a silent rank's). With `waitForStale`
  // it first waits (at most staleAfter + 2 periods) until some rank is stale: a failure seen at
  // once (a closed connection) comes before the dead rank's key went stale.
  std::string explainFailure(bool waitForStale);

  class State;  // shared with the thread

 private:
  std::shared_ptr<State> state_;
  OwnedThread thread_;
};

// This rank's host label: the host name, and the launcher's node rank where it is set
// (namespace hosts share a host name).
std::string hostLabel();

}  // namespace drun::torch_backend

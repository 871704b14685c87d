// MembershipWatcher: turns what happens to one closed round in the store into JobEvents.
//
// It watches rdzv/<id>/<r>/changes on a connection of its own (the agent's connection stays free
// for its own calls) and, after every change, reads the round's job state to say what happened:
// a failure record (Failed), every member finished (Succeeded), a member gone (MemberLost: its
// will fired or it was preempted), a node waiting to join (NodeWaiting). Each is reported once,
// except Succeeded: at every look (it is the job's last word; an agent must not miss it). The
// job's outcome is also read when a watch slice ends with no change: a round that never changes
// again (its members re-formed while this node waited in the exit barrier) still ends.
// A watch is never longer than `slice`: a connection that does not answer within slice plus the
// client's grace is lost (a cut link, a dead store host), and StoreLost is reported, last.
//
// Threading: an OwnedThread (signals blocked) that shares its store and owns its copy of the
// round. Destroying the watcher interrupts its connection (Store::interrupt), so the thread and
// its connection end at once, not a slice later (a job re-forming every few ms would otherwise
// hold one connection per recent round), and parks the thread (parked_threads.hpp: joined once
// it ended, or at exit within a bound); destroying never waits on the network.
// Ownership: the callback slot is shared with the rendezvous, which may replace the callback.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "drun/common/owned_thread.hpp"
#include "drun/rendezvous/rendezvous.hpp"
#include "drun/store/store.hpp"

namespace drun::rdzv {

struct EventSlot {
  std::mutex mutex;
  std::function<void(const JobEvent&)> callback;
};

struct WatchedRound {
  std::string runId;
  uint64_t round = 0;
  int nodeCount = 1;
  int64_t changesAtClose = 0;  // the watch starts here: every later change is looked at
  int64_t leftAtClose = 0;     // members lost = lost - leftAtClose (equal to left at the close)
  int64_t lostSeen = 0;        // members lost already known at the start (a spare that took a
                               // lost member's place: that loss is not news to it)
  std::string endpoint;        // for messages
  milliseconds slice{2000};    // the longest single watch
};

class MembershipWatcher {
 public:
  MembershipWatcher(std::unique_ptr<LivenessStore> store, WatchedRound round,
                    std::shared_ptr<EventSlot> slot);
  // After the destructor returns, the callback is not running and will not be called by this
  // watcher.
  ~MembershipWatcher();
  MembershipWatcher(const MembershipWatcher&) = delete;
  MembershipWatcher& operator=(const MembershipWatcher&) = delete;

 private:
  std::shared_ptr<EventSlot> slot_;
  std::shared_ptr<std::atomic<bool>> stopped_;
  std::shared_ptr<LivenessStore> store_;  // shared with the thread: interrupted on destruction
  OwnedThread thread_;
};

}  // namespace drun::rdzv

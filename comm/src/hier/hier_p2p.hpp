// HierP2P: point to point of a hierarchical communicator. A peer on this host is reached over
// the host's shared-memory segment (ShmP2P), a peer on another host over the full Gloo mesh.
//
// Remote messages travel behind a 24-byte header (length, and where the payload is): up to
// kInlineBytes inline in the header's Gloo message (one copy on each side), larger ones as a
// second Gloo message on a tag of their own (sequence-numbered per pair: straight from the
// sender's buffer into the receiver's). Every header receive has room for any header, so a
// receive that did not choose its message knows what it got and never takes a payload.
// A receive from any source listens on both transports at once:
//   local leg   a receive from any rank of the segment, into the caller's buffer
//   remote leg  a Gloo receive of a header from any rank of another host
// The first leg to get a message decides: the local leg matching one makes the remote leg an
// orphan; the remote leg completing while the local one matched nothing withdraws it
// (ShmP2P::cancel is atomic with matching). Gloo cannot withdraw a posted receive, so an orphan
// stays posted until a remote header arrives, which is then kept (stash) for the next receive
// that matches it (its payload, if separate, waits at its sender until then): a message is
// never dropped. While a tag's remote leg is posted, later receives of that tag from remote
// ranks wait here (held), so that none overtakes what the orphan catches; receives from local
// ranks go straight to the segment (its matching keeps posting order). A receive from a given rank of this host never waits for anything remote.
//
// Progress: whoever waits or tests drives this layer; the Gloo poller (legs are polled) and the
// segment's progress thread only ring `signal_`. Remote legs have no deadline of their own (an
// orphan's wait must not break Gloo's context): the operation's deadline is kept here and by
// its local leg.
// Threading: thread-safe (one mutex; the backends' locks are only ever taken inside it).
// Ownership: shared by the hierarchical backend and every request it returned; stop() (the
// backend's destruction or abort) fails what is pending, after which the backends are not used.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend.hpp"

namespace drun::comm::detail {

class HierP2P : public std::enable_shared_from_this<HierP2P> {
 public:
  // localIndex: per rank of the communicator, its index in this host's segment, or -1 when it
  // is on another host. local: the host's shm backend, or null when this rank is alone there;
  // full: the Gloo mesh of every rank.
  HierP2P(Backend* local, Backend& full, std::vector<int> localIndex);

  std::shared_ptr<Request::State> isend(const void* buf, size_t bytes, int dst, int tag, milliseconds timeout);
  std::shared_ptr<Request::State> irecv(void* buf, size_t bytes, int src, int tag, milliseconds timeout);
  // Fails every operation tracked here; later calls throw CommError.
  void stop(const std::string& why);

  struct Signal;  // a counter rung on every completion, and a wait for it to change
  struct Recv;

 private:
  struct Header;  // what a header receive got
  struct Stashed;
  struct Leg;     // a posted remote leg of a receive from any source
  struct TagState {
    std::shared_ptr<Leg> leg;                 // at most one per tag
    std::deque<std::shared_ptr<Recv>> held;   // remote-capable receives behind it, in order
    std::deque<std::shared_ptr<Stashed>> stash;  // what orphans caught, in arrival order
  };

  // mutex_ held for all of these.
  void driveLocked(int tag);
  void settleLeg(TagState& t);
  void dispatchHeld(TagState& t);
  bool takeStashed(TagState& t, Recv& r);  // true: r needs nothing remote any more
  void postHeader(Recv& r);                // the Gloo receive of a remote rank's header
  void postLeg(TagState& t, const std::shared_ptr<Recv>& r);
  // r gets the message whose header `h` came from `src`: its payload inline, or posted for.
  void deliver(Recv& r, int src, const Header& h);
  void complete(Recv& r, std::exception_ptr error = nullptr);

  Backend* local_;
  Backend& full_;
  std::vector<int> localIndex_;
  std::vector<int> rankOfLocal_;  // per segment index: the communicator rank
  std::vector<int> remoteRanks_;
  std::shared_ptr<Signal> signal_;
  std::mutex mutex_;
  std::map<int, TagState> tags_;
  std::vector<uint32_t> payloadSeq_;  // per destination: the next separate payload's number
  std::string stopped_;  // why operations fail now ("" while usable)
};

}  // namespace drun::comm::detail

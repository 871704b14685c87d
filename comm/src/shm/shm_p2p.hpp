// ShmP2P: send/recv (tags, receive from any source, asynchronous) over a ShmSegment's rings:
// one single-producer single-consumer ring of cells per ordered pair of ranks. A message is cut
// into cells {tag, length, total, offset}; the receiver matches a message's first cell to the
// first posted receive with that source (or any) and tag, or keeps it as unexpected (on the heap)
// until one is posted, so messages never block each other — up to `maxUnexpectedBytes` kept per
// rank: a message that would pass it stays in its ring (its sender waits, and times out) until a
// receive for it is posted, so a sender cannot fill this rank's heap.
//
// Progress: whoever waits or tests a request drives it (spinning briefly), and one progress
// thread per communicator (started on the first operation) drives every pending one in the
// background, sleeping on this rank's doorbell futex when nothing moves; it fails operations
// whose deadline passed or whose peer died (naming it). No thread per request.
// Threading: thread-safe (one mutex). Ownership: shared by the backend and every request; the
// segment lives as long as either.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend.hpp"
#include "shm/shm_segment.hpp"

namespace drun::comm::detail {

class ShmP2P : public std::enable_shared_from_this<ShmP2P> {
 public:
  ShmP2P(std::shared_ptr<ShmSegment> segment, size_t maxUnexpectedBytes);
  ~ShmP2P();

  std::shared_ptr<Request::State> isend(const void* buf, size_t bytes, int dst, int tag, milliseconds timeout);
  std::shared_ptr<Request::State> irecv(void* buf, size_t bytes, int src, int tag, milliseconds timeout);
  // Withdraws a receive of this engine's that matched no message yet (true; it is done, and no
  // message will go to it); false once it matched one.
  bool cancel(Request::State& request);
  // Called (under this engine's mutex) whenever an operation completes.
  void setListener(std::function<void()> listener);
  // Fails every pending operation and stops the progress thread.
  void stop(const std::string& why);

  struct Op;

 private:
  struct Unexpected;
  struct Inbound;  // the message arriving from one source
  friend struct Op;

  std::shared_ptr<Op> makeOp(bool isSend, void* buf, size_t bytes, int peer, int tag, milliseconds timeout);
  bool progress();  // mutex_ held; true when anything moved
  bool pushSends(int dst);
  bool drain(int src);
  void forget(const std::shared_ptr<Unexpected>& kept);  // out of unexpected_, and its bytes
  void checkFailures();
  void complete(const std::shared_ptr<Op>& op, std::exception_ptr error = nullptr);
  void loop();
  void startLocked();
  bool pendingLocked() const;

  std::shared_ptr<ShmSegment> seg_;
  std::mutex mutex_;
  std::condition_variable cv_;  // an op completed, or work arrived for the thread
  std::vector<std::deque<std::shared_ptr<Op>>> sends_;  // per destination, in order
  std::list<std::shared_ptr<Op>> recvs_;                 // posted, in order
  std::vector<std::shared_ptr<Inbound>> inbound_;        // per source
  std::list<std::shared_ptr<Unexpected>> unexpected_;    // arrived before their receive
  const size_t maxUnexpectedBytes_;
  size_t unexpectedBytes_ = 0;  // the sizes of unexpected_'s messages
  std::thread thread_;
  bool stopping_ = false;
  std::string stopped_;  // why operations fail now
  std::function<void()> listener_;
};

}  // namespace drun::comm::detail

// ShmSegment: the memory the ranks of one communicator on one host share, and the waits on it.
//
// Lifecycle: rank 0 of the communicator creates an anonymous memfd (never a name in /dev/shm),
// sizes and maps it, and publishes "<pid> <fd>" in the store; every other rank takes the same
// file with pidfd_getfd (or /proc/<pid>/fd/<fd> where that is refused) and maps it. Once every
// rank reported its attach, rank 0 closes the fd: the memory lives exactly as long as one rank
// still maps it, and the kernel frees it when the last one exits, SIGKILL included.
//
// Layout: a header (per-rank sequence flags, pids, a futex word), per rank a collective slot
// of two halves (data written for flag value k lives in half k%2), then one ring of cells per
// ordered pair of ranks for point-to-point messages.
//
// Waits: spin briefly, then yield, then sleep on a futex; every wait has a deadline and checks
// the peers' pidfds, so a rank that died fails the wait naming it.
// Threading: publish/waitAll belong to the one thread running collectives; the p2p doorbell
// calls are thread-safe. Ownership: unmaps on destruction.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "drun/common/deadline.hpp"
#include "drun/store/store.hpp"

namespace drun::comm::detail {

struct ShmOptions {
  size_t slotBytes = 4u << 20;   // per rank, both halves (DRUN_COMM_SHM_BYTES)
  size_t cellBytes = 32u << 10;  // one point-to-point cell (header included)
  size_t cells = 8;              // cells per ordered pair of ranks
  bool singleCopy = true;        // process_vm_readv where allowed (DRUN_COMM_SHM_SINGLE_COPY)
  // Point-to-point bytes a rank keeps for receives not posted yet; a message that would pass it
  // stays in its ring, so the sender waits (DRUN_COMM_SHM_UNEXPECTED_BYTES).
  size_t unexpectedBytes = 64u << 20;
  // The communicator's rank of each rank of the segment, for messages (empty: the same; a
  // hierarchical host's segment holds some of its communicator's ranks).
  std::vector<int> rankNames;
  // How long a collective's wait spins (or yields) before it sleeps on the futex.
  std::chrono::microseconds busyWait{10000};
};

// A collective's deadline, read from the clock when one of its waits first finds a peer not
// there yet: a small collective that never waits (a queued broadcast's root, a reader whose data
// is there) reads no clock (a clock read is a large part of an 8-byte broadcast). Before
// that first wait the operation did only bounded local work (copies into the segment), which is
// all the deadline can move by. One thread (the collective's).
class OpDeadline {
 public:
  explicit OpDeadline(milliseconds timeout) : timeout_(timeout) {}
  const Deadline& get() const {
    if (!deadline_) deadline_.emplace(timeout_);
    return *deadline_;
  }

 private:
  milliseconds timeout_;
  mutable std::optional<Deadline> deadline_;  // (a Deadline constructed empty reads the clock)
};

// One point-to-point cell's header; the payload follows at kCellHeader.
struct ShmCell {
  uint32_t tag;
  uint32_t length;  // payload bytes in this cell
  uint64_t total;   // the whole message's bytes
  uint64_t offset;  // this cell's place in the message
};

class ShmSegment {
 public:
  static constexpr size_t kCellHeader = 64;

  // Creates (rank 0) or attaches the segment through `store` (a prefix of this communicator).
  // Throws CommError when it cannot be shared (every rank throws: the attach results are
  // exchanged), TimeoutError when a rank does not come within `timeout`.
  ShmSegment(rdzv::Store& store, int rank, int size, const ShmOptions& options, milliseconds timeout);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t halfBytes() const { return halfBytes_; }
  // Half h of rank r's collective slot.
  char* half(int r, uint64_t h) const;
  // Stamped lines: per rank and half parity, kStampedSubSlots cache lines of kStampedPayload
  // bytes of data and a stamp (the step that wrote it), in an area of their own. A step whose
  // data fits writes it there and stamps it before it publishes its flag, so that a reader's
  // wait and its read of the data are one cache miss, not two (two misses, flag line then data
  // line, put an 8-byte all_gather at several times OpenMPI's latency: docs/benchmarks/comm.md).
  static constexpr size_t kStampedPayload = 56;
  static constexpr uint64_t kStampedSubSlots = 16;
  static constexpr size_t kNoStamp = ~size_t{0};
  // Sub-slot `sub` of step k's line of rank r (parity k % 2).
  char* stampedLine(int r, uint64_t k, size_t sub = 0) const;
  // Marks a stamped line as written by step k (release: its data first).
  static void stamp(char* line, uint64_t k);
  // Maps the page at `address` (within the segment) for this process now, without changing its
  // contents (MADV_POPULATE_WRITE; best effort: a kernel without it faults the page on use).
  void prefault(const char* address) const;

  // ---- collectives: one thread ----
  // Sets this rank's flag to `value` (release) and wakes sleepers.
  void publish(uint64_t value);
  // Until every rank's flag (or `only`'s) >= value, or the deadline (TimeoutError), or a peer died / aborted
  // (CommError naming it). `what` names the operation in the error.
  // only >= 0: that rank's flag alone.
  // Flags only grow: a flag seen at or above `value` once is not loaded again (the root of
  // queued broadcasts and their readers mostly wait for values they already saw, and every load
  // of a flag a peer just wrote is a cache miss).
  // stampedSub != kNoStamp: a rank whose stamped line (value, stampedSub) carries value counts as
  // there (it stamps before it publishes), with no load of its flag.
  void waitAll(uint64_t value, const OpDeadline& deadline, const char* what, int only = -1,
               size_t stampedSub = kNoStamp);

  // ---- point to point ----
  // Cell i of the ring src -> dst, and the ring's counters (producer: tail, consumer: head).
  ShmCell* cell(int src, int dst, uint64_t index) const;
  std::atomic<uint64_t>& ringHead(int src, int dst) const;
  std::atomic<uint64_t>& ringTail(int src, int dst) const;
  size_t cells() const { return options_.cells; }
  size_t cellPayload() const { return options_.cellBytes - kCellHeader; }
  // Rings rank r's doorbell (something for it to do), and sleeps on this rank's own until it
  // changes from `seen` or `timeout` passes.
  void ring(int r);
  uint32_t bell() const;
  void sleepOnBell(uint32_t seen, milliseconds timeout);

  // ---- single copy (process_vm_readv), where every rank may read every other's memory ----
  bool singleCopy() const { return singleCopy_; }
  // This rank's send buffer for the current operation; visible to the others with its next publish.
  void publishBuffer(const void* send);
  uint64_t sendAddr(int r) const;
  // Every rank has a core of its own (ranks <= cores): spinning and single copy pay only then.
  bool ranksHaveCores() const;
  // Copies `bytes` at `address` in rank r's memory into `into`; CommError (naming r when it is
  // gone) on failure.
  void readPeer(int r, uint64_t address, void* into, size_t bytes) const;

  // Rank r of the segment as its communicator numbers it.
  int nameOf(int r) const {
    return static_cast<size_t>(r) < options_.rankNames.size() ? options_.rankNames[static_cast<size_t>(r)] : r;
  }
  // After a failure (or when a new generation began): every rank's waits fail at once, this
  // rank's own too (an abort from another thread of this process: the watcher's).
  void abort();
  // "" while rank r lives, else "rank r (pid N) is gone" / "... aborted ...".
  std::string peerFailure(int r) const;
  // The first failed rank among all, as peerFailure says it; "" when none.
  std::string anyFailure() const;

 private:
  struct Header;
  Header& header() const;
  void attachPeers();
  void layout();  // offsets from options_ and size_
  void probeSingleCopy(rdzv::Store& store, milliseconds timeout);

  int rank_, size_;
  ShmOptions options_;
  size_t totalBytes_ = 0, halfBytes_ = 0, linesOffset_ = 0, slotsOffset_ = 0, ringsOffset_ = 0, ringBytes_ = 0;
  char* base_ = nullptr;
  bool singleCopy_ = false;
  uint64_t probeWord_ = 0;  // read by the peers' probe
  std::vector<int> pidfds_;  // per peer, -1 for self or where pidfd_open is refused
  std::vector<int> pids_;
  std::chrono::nanoseconds spinBudget_{std::chrono::microseconds(50)};  // waitAll's (collectives' thread)
  std::atomic<bool> abortedHere_{false};  // abort() was called in this process
  std::vector<uint64_t> seenFlags_;  // per rank, the highest flag waitAll loaded (collectives' thread)
};

}  // namespace drun::comm::detail

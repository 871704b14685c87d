#include "shm/shm_segment.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <thread>

#include "drun/common/error.hpp"

namespace drun::comm::detail {
namespace {

constexpr uint64_t kSegmentMagic = 0x6472756e73686d31ull;  // "drunshm1"
constexpr size_t kLine = 64;
constexpr size_t kFixedHeader = 256;
const std::string kSegmentKey = "shm/segment";
std::string attachedKey(int r) { return "shm/attached/" + std::to_string(r); }

size_t alignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

int futexWait(std::atomic<uint32_t>* word, uint32_t expected, milliseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000), static_cast<long>(timeout.count() % 1000) * 1000000};
  return static_cast<int>(syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0));
}
void futexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spinning only pays when every rank has a core; oversubscribed ranks yield at once. (Asked
// once: glibc reads /sys for every hardware_concurrency() call.)
// How long a wait spins before it yields (see waitAll): a few collective steps' worth.
constexpr std::chrono::microseconds kSpinFirst{50};
constexpr std::chrono::microseconds kSpinFloor{1};  // what an adaptive budget retries from

bool oversubscribed(int ranks) {
  static const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return ranks > cores;
}

struct alignas(kLine) RankLine {
  std::atomic<uint64_t> flag;
  std::atomic<int32_t> pid;
  std::atomic<uint64_t> probe;     // the address of this rank's probe word (single-copy probe)
  std::atomic<uint64_t> sendAddr;  // this rank's send buffer in the current operation (single copy)
};
constexpr uint64_t kProbeMagic = 0x636d612d70726f62ull;  // "cma-prob"
struct alignas(kLine) BellLine {
  std::atomic<uint32_t> bell;
  std::atomic<uint32_t> sleepers;
};
struct alignas(kLine) CounterLine {
  std::atomic<uint64_t> value;
};

}  // namespace

struct ShmSegment::Header {
  uint64_t magic;
  uint32_t size;
  alignas(kLine) std::atomic<uint32_t> epoch;  // the collectives' futex word
  std::atomic<uint32_t> sleepers;
  alignas(kLine) std::atomic<int32_t> abortedBy;  // rank + 1 of the first rank that aborted
  RankLine* ranks() { return reinterpret_cast<RankLine*>(reinterpret_cast<char*>(this) + kFixedHeader); }
  BellLine* bells() { return reinterpret_cast<BellLine*>(ranks() + size); }
  CounterLine* counters() { return reinterpret_cast<CounterLine*>(bells() + size); }  // head, tail per pair
};

ShmSegment::ShmSegment(rdzv::Store& store, int rank, int size, const ShmOptions& options,
                       milliseconds timeout)
    : rank_(rank), size_(size), options_(options), pidfds_(static_cast<size_t>(size), -1),
      pids_(static_cast<size_t>(size), 0), seenFlags_(static_cast<size_t>(size), 0) {
  int fd = -1;
  std::string problem;
  if (rank == 0) {
    fd = memfd_create("drun-comm", MFD_CLOEXEC);
    if (fd < 0) problem = std::string("memfd_create: ") + std::strerror(errno);
    layout();
    if (problem.empty() && ftruncate(fd, static_cast<off_t>(totalBytes_)) != 0)
      problem = std::string("ftruncate: ") + std::strerror(errno);
    std::ostringstream text;
    text << getpid() << ' ' << fd << ' ' << options_.slotBytes << ' ' << options_.cellBytes << ' '
         << options_.cells;
    store.set(kSegmentKey, problem.empty() ? text.str() : "error " + problem);
  } else {
    std::istringstream text(store.get(kSegmentKey, timeout));
    std::string first;
    int remoteFd = -1;
    text >> first >> remoteFd >> options_.slotBytes >> options_.cellBytes >> options_.cells;
    if (first == "error" || !text) {
      problem = "rank 0 could not create it: " + text.str();
    } else if (options_.cells < 1 || options_.cells > 4096 || options_.cellBytes <= kCellHeader ||
               options_.cellBytes > (64u << 20) || options_.slotBytes > (size_t{1} << 40)) {
      problem = "rank 0 published a layout out of range: '" + text.str() + "'";  // the store is input
    } else {
      pid_t pid = static_cast<pid_t>(std::stol(first));
      int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
      if (pidfd >= 0) {
        fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, remoteFd, 0));
        close(pidfd);
      }
      if (fd < 0) {  // pidfd_getfd needs ptrace rights (Yama); /proc/<pid>/fd only read rights
        std::string path = "/proc/" + first + "/fd/" + std::to_string(remoteFd);
        fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
        if (fd < 0) problem = "cannot take rank 0's memfd (pidfd_getfd, " + path + "): " + std::strerror(errno);
      }
    }
  }
  layout();  // rank 0's options: the same on every rank
  if (problem.empty()) {
    struct stat st{};
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < totalBytes_) {
      problem = "the segment is smaller than its layout";
    } else {
      void* p = mmap(nullptr, totalBytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) problem = std::string("mmap: ") + std::strerror(errno);
      else base_ = static_cast<char*>(p);
    }
  }
  if (base_) {
    Header& h = header();
    if (rank == 0) {
      h.size = static_cast<uint32_t>(size);
      h.magic = kSegmentMagic;
    }
    // The word is written before its address is published: a peer may probe it as soon as the
    // attach barrier below lets it (a word written only when this rank probed would read 0 for
    // the peer that probed first, and single copy would be off for the whole communicator).
    probeWord_ = kProbeMagic;
    h.ranks()[rank].probe.store(reinterpret_cast<uint64_t>(&probeWord_), std::memory_order_relaxed);
    h.ranks()[rank].pid.store(getpid(), std::memory_order_release);
  }
  if (rank != 0 && fd >= 0) close(fd);
  store.set(attachedKey(rank), problem.empty() ? "ok" : problem);
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(attachedKey(r));
  std::vector<rdzv::Bytes> results;
  try {
    results = store.multiGet(keys, timeout);
  } catch (...) {
    if (fd >= 0 && rank == 0) close(fd);
    if (base_) munmap(base_, totalBytes_);
    throw;
  }
  // Every rank mapped it (or gave up): nobody needs the fd any more.
  if (rank == 0 && fd >= 0) close(fd);
  std::string failed;
  for (int r = 0; r < size; ++r)
    if (results[static_cast<size_t>(r)] != "ok") failed += "; rank " + std::to_string(r) + ": " + results[static_cast<size_t>(r)];
  if (!failed.empty()) {
    if (base_) munmap(base_, totalBytes_);
    base_ = nullptr;
    throw CommError("shared memory segment unusable" + failed);
  }
  if (header().magic != kSegmentMagic || header().size != static_cast<uint32_t>(size))
    throw CommError("shared memory segment: bad header");
  attachPeers();
  probeSingleCopy(store, timeout);
}

// process_vm_readv needs ptrace read rights on the peer (Yama scope >= 1 or a container's
// seccomp refuses it): every rank reads every peer's probe word, and single copy is used only
// when every rank could (the ranks agree through the store).
void ShmSegment::probeSingleCopy(rdzv::Store& store, milliseconds timeout) {
  bool ok = options_.singleCopy;
  for (int r = 0; r < size_ && ok; ++r) {
    if (r == rank_) continue;
    uint64_t got = 0;
    iovec local{&got, sizeof(got)};
    iovec remote{reinterpret_cast<void*>(header().ranks()[r].probe.load()), sizeof(got)};
    ok = process_vm_readv(pids_[static_cast<size_t>(r)], &local, 1, &remote, 1, 0) == sizeof(got) &&
         got == kProbeMagic;
  }
  store.set("shm/single_copy/" + std::to_string(rank_), ok ? "1" : "0");
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) keys.push_back("shm/single_copy/" + std::to_string(r));
  auto all = store.multiGet(keys, timeout);
  singleCopy_ = std::all_of(all.begin(), all.end(), [](const auto& v) { return v == "1"; });
}

void ShmSegment::publishBuffer(const void* send) {
  // publish() releases it
  header().ranks()[rank_].sendAddr.store(reinterpret_cast<uint64_t>(send), std::memory_order_relaxed);
}
uint64_t ShmSegment::sendAddr(int r) const { return header().ranks()[r].sendAddr.load(std::memory_order_relaxed); }
bool ShmSegment::ranksHaveCores() const { return !oversubscribed(size_); }

void ShmSegment::readPeer(int r, uint64_t address, void* into, size_t bytes) const {
  char* to = static_cast<char*>(into);
  while (bytes > 0) {
    iovec local{to, bytes};
    iovec remote{reinterpret_cast<void*>(address), bytes};
    ssize_t got = process_vm_readv(pids_[static_cast<size_t>(r)], &local, 1, &remote, 1, 0);
    if (got <= 0) {
      std::string failure = peerFailure(r);
      throw CommError("shm: reading rank " + std::to_string(nameOf(r)) + "'s buffer: " +
                      (failure.empty() ? std::string(std::strerror(errno)) + " (did the ranks pass the same sizes?)" : failure));
    }
    to += got;
    address += static_cast<uint64_t>(got);
    bytes -= static_cast<size_t>(got);
  }
}

void ShmSegment::layout() {
  options_.slotBytes = alignUp(std::max<size_t>(options_.slotBytes, 8192), 8192);
  halfBytes_ = options_.slotBytes / 2;
  const size_t controls = kFixedHeader + (2 * static_cast<size_t>(size_) + 2 * static_cast<size_t>(size_) * size_) * kLine;
  linesOffset_ = alignUp(controls, kLine);
  slotsOffset_ = alignUp(linesOffset_ + static_cast<size_t>(size_) * 2 * kStampedSubSlots * kLine, 4096);
  ringsOffset_ = slotsOffset_ + options_.slotBytes * static_cast<size_t>(size_);
  ringBytes_ = options_.cellBytes * options_.cells;
  totalBytes_ = ringsOffset_ + ringBytes_ * static_cast<size_t>(size_) * static_cast<size_t>(size_);
}

ShmSegment::~ShmSegment() {
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
  if (base_) munmap(base_, totalBytes_);
}

void ShmSegment::attachPeers() {
  for (int r = 0; r < size_; ++r) {
    pids_[static_cast<size_t>(r)] = header().ranks()[r].pid.load(std::memory_order_acquire);
    if (r != rank_) pidfds_[static_cast<size_t>(r)] = static_cast<int>(syscall(SYS_pidfd_open, pids_[static_cast<size_t>(r)], 0));
  }
}

ShmSegment::Header& ShmSegment::header() const { return *reinterpret_cast<Header*>(base_); }

char* ShmSegment::half(int r, uint64_t h) const {
  return base_ + slotsOffset_ + static_cast<size_t>(r) * options_.slotBytes + (h & 1) * halfBytes_;
}

char* ShmSegment::stampedLine(int r, uint64_t k, size_t sub) const {
  return base_ + linesOffset_ + ((static_cast<size_t>(r) * 2 + (k & 1)) * kStampedSubSlots + sub) * kLine;
}

void ShmSegment::stamp(char* line, uint64_t k) {
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(line + kStampedPayload)).store(k, std::memory_order_release);
}

void ShmSegment::prefault(const char* address) const {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const auto at = reinterpret_cast<uintptr_t>(address) / page * page;
#ifdef MADV_POPULATE_WRITE
  madvise(reinterpret_cast<void*>(at), page, MADV_POPULATE_WRITE);
#else
  (void)at;
#endif
}

void ShmSegment::publish(uint64_t value) {
  Header& h = header();
  h.ranks()[rank_].flag.store(value, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (h.sleepers.load(std::memory_order_relaxed) > 0) {
    h.epoch.fetch_add(1, std::memory_order_seq_cst);
    futexWakeAll(&h.epoch);
  }
}

void ShmSegment::waitAll(uint64_t value, const OpDeadline& opDeadline, const char* what, int only, size_t stampedSub) {
  Header& h = header();
  RankLine* ranks = h.ranks();
  uint64_t* seen = seenFlags_.data();
  const int end = only < 0 ? size_ : only + 1;
  int behind = only < 0 ? 0 : only;  // the first rank not there yet: where the scan resumes
  auto stamped = [&](int r) {
    char* line = stampedLine(r, value, stampedSub);
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(line + kStampedPayload)).load(std::memory_order_acquire) >= value;
  };
  auto ready = [&] {
    for (; behind < end; ++behind) {
      if (seen[behind] >= value) continue;  // acquired when it was seen: its data is visible
      if (stampedSub != kNoStamp && stamped(behind)) {  // it reached `value` (its flag follows)
        seen[behind] = value;
        continue;
      }
      seen[behind] = ranks[behind].flag.load(std::memory_order_acquire);
      if (seen[behind] < value) return false;
    }
    return true;
  };
  if (ready()) return;
  const Deadline& deadline = opDeadline.get();
  const auto start = Clock::now();
  // Adaptive: a rank with a core of its own spins first (a sleep hands the core away for a time
  // slice, milliseconds: OpenMPI spins for the same reason), but only for kSpinFirst: on a loaded
  // machine (other jobs, other helpers) the awaited rank may need this very core, so the wait
  // then yields (free when nothing else is runnable, a hand-over when something is), and sleeps
  // on the futex after options_.busyWait, so that a long wait costs no CPU (the hierarchical
  // backend's hosts wait for TCP: a short budget).
  // The spin budget adapts (spinBudget_): it halves after a wait that its spin did not end and
  // doubles, up to kSpinFirst, after one that it did: a fixed spin makes every small operation
  // as long as the whole spin whenever the peer is not running (the spin, then the yield that
  // lets it run). Where the ranks share a core the budget falls to about a microsecond; where
  // each has one it stays above the typical wait. Oversubscribed ranks yield at once: a spin
  // first is as fast at best and slower when fixed (the awaited rank needs this core). Figures:
  // docs/benchmarks/comm.md.
  const auto budget = oversubscribed(size_) ? std::chrono::nanoseconds(0) : spinBudget_;
  auto adapt = [&](bool spinEnded) {
    if (spinEnded) spinBudget_ = std::min<std::chrono::nanoseconds>(kSpinFirst, std::max<std::chrono::nanoseconds>(2 * budget, kSpinFloor));
    else spinBudget_ = budget > std::chrono::nanoseconds(0) ? budget / 2 : std::chrono::nanoseconds(kSpinFloor);
  };
  while (Clock::now() - start < options_.busyWait && !abortedHere_.load(std::memory_order_relaxed)) {
    if (Clock::now() - start < budget) {
      for (int k = 0; k < 64; ++k, cpuRelax())  // ~1 us of pauses per clock read (Zen: ~60 cycles each)
        if (ready()) return adapt(true);
    } else {
      if (ready()) return adapt(false);
      sched_yield();
    }
  }
  adapt(false);
  for (;;) {
    const uint32_t epoch = h.epoch.load(std::memory_order_seq_cst);
    h.sleepers.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    bool ok = ready();
    if (!ok) futexWait(&h.epoch, epoch, std::min(deadline.remaining(), milliseconds(5)) + milliseconds(1));
    h.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (ok || ready()) return;
    for (int r = behind; r < end; ++r) {
      if (ranks[r].flag.load(std::memory_order_acquire) >= value) continue;
      std::string failure = peerFailure(r);
      if (!failure.empty()) throw CommError(std::string("shm ") + what + ": " + failure);
    }
    if (int by = h.abortedBy.load(std::memory_order_acquire); by > 0 && by != rank_ + 1)
      throw CommError(std::string("shm ") + what + ": " + peerFailure(by - 1));
    if (abortedHere_.load(std::memory_order_acquire))
      throw CommError(std::string("shm ") + what + ": this rank aborted the communicator");
    if (deadline.expired())
      throw TimeoutError(std::string("shm ") + what + " timed out waiting for rank " + std::to_string(nameOf(behind)));
  }
}

ShmCell* ShmSegment::cell(int src, int dst, uint64_t index) const {
  char* ring = base_ + ringsOffset_ + (static_cast<size_t>(src) * size_ + dst) * ringBytes_;
  return reinterpret_cast<ShmCell*>(ring + (index % options_.cells) * options_.cellBytes);
}
std::atomic<uint64_t>& ShmSegment::ringHead(int src, int dst) const {
  return header().counters()[2 * (src * size_ + dst)].value;
}
std::atomic<uint64_t>& ShmSegment::ringTail(int src, int dst) const {
  return header().counters()[2 * (src * size_ + dst) + 1].value;
}

void ShmSegment::ring(int r) {
  BellLine& b = header().bells()[r];
  b.bell.fetch_add(1, std::memory_order_seq_cst);
  if (b.sleepers.load(std::memory_order_seq_cst) > 0) futexWakeAll(&b.bell);
}
uint32_t ShmSegment::bell() const { return header().bells()[rank_].bell.load(std::memory_order_seq_cst); }
void ShmSegment::sleepOnBell(uint32_t seen, milliseconds timeout) {
  BellLine& b = header().bells()[rank_];
  b.sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (b.bell.load(std::memory_order_seq_cst) == seen) futexWait(&b.bell, seen, timeout);
  b.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

void ShmSegment::abort() {
  if (!base_) return;
  abortedHere_.store(true, std::memory_order_release);
  Header& h = header();
  int32_t none = 0;
  h.abortedBy.compare_exchange_strong(none, rank_ + 1);
  h.epoch.fetch_add(1, std::memory_order_seq_cst);
  futexWakeAll(&h.epoch);
  for (int r = 0; r < size_; ++r) ring(r);
}

std::string ShmSegment::peerFailure(int r) const {
  if (r == rank_) return {};
  const int pid = pids_[static_cast<size_t>(r)];
  bool gone = false;
  if (int fd = pidfds_[static_cast<size_t>(r)]; fd >= 0) {
    pollfd p{fd, POLLIN, 0};
    gone = poll(&p, 1, 0) > 0;  // a pidfd is readable once its process exited
  } else {
    gone = kill(pid, 0) != 0 && errno == ESRCH;
  }
  if (gone) return "rank " + std::to_string(nameOf(r)) + " (pid " + std::to_string(pid) + ") is gone";
  if (header().abortedBy.load(std::memory_order_acquire) == r + 1)
    return "rank " + std::to_string(nameOf(r)) + " (pid " + std::to_string(pid) + ") aborted the communicator after a failure";
  return {};
}

std::string ShmSegment::anyFailure() const {
  for (int r = 0; r < size_; ++r)
    if (auto f = peerFailure(r); !f.empty()) return f;
  return {};
}

}  // namespace drun::comm::detail

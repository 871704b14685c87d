// The worker side of the drun channel (drun/worker_channel.h): maps the page named by
// DRUN_WORKER_CHANNEL on first use and writes heartbeats and sections with atomic stores.
#include "drun/worker.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "drun/worker_channel.h"

namespace {

constexpr int kMaxDepth = 8;

struct Frame {
  char name[DRUN_CHANNEL_SECTION_MAX];
  int64_t startNs;
};

struct Channel {
  unsigned char* page = nullptr;  // null: no agent listens
  std::mutex sectionLock;         // one writer of the section fields at a time
  Frame stack[kMaxDepth];
  int depth = 0;  // may exceed kMaxDepth: frames beyond it are not recorded
};

int64_t monotonicNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

template <typename T>
T* field(unsigned char* page, int offset) {
  return reinterpret_cast<T*>(page + offset);
}

// Printable ASCII, at most DRUN_CHANNEL_SECTION_MAX - 1 bytes, NUL-terminated.
void copyName(char* out, const char* name) {
  size_t n = 0;
  for (; name && name[n] && n + 1 < DRUN_CHANNEL_SECTION_MAX; ++n) {
    const unsigned char ch = static_cast<unsigned char>(name[n]);
    out[n] = ch >= 0x20 && ch < 0x7f ? static_cast<char>(ch) : '?';
  }
  out[n] = '\0';
}

unsigned char* mapChannel() {
  const char* path = std::getenv(DRUN_CHANNEL_ENV);
  if (!path || !*path) return nullptr;
  int fd = ::open(path, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return nullptr;
  struct stat st;
  void* page = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= DRUN_CHANNEL_SIZE)
    page = ::mmap(nullptr, DRUN_CHANNEL_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (page == MAP_FAILED) return nullptr;
  auto* p = static_cast<unsigned char*>(page);
  if (*field<uint32_t>(p, DRUN_CHANNEL_OFF_MAGIC) != DRUN_CHANNEL_MAGIC ||
      *field<uint32_t>(p, DRUN_CHANNEL_OFF_VERSION) != DRUN_CHANNEL_VERSION) {
    ::munmap(page, DRUN_CHANNEL_SIZE);
    return nullptr;
  }
  __atomic_store_n(field<int64_t>(p, DRUN_CHANNEL_OFF_PID), static_cast<int64_t>(::getpid()),
                   __ATOMIC_RELAXED);
  return p;
}

// Mapped once, on the first call from any thread; never unmapped (the process may beat from a
// destructor at exit).
Channel& channel() {
  static Channel* instance = [] {
    auto* c = new Channel;
    c->page = mapChannel();
    return c;
  }();
  return *instance;
}

void beat(unsigned char* page, int64_t now) {
  __atomic_fetch_add(field<uint64_t>(page, DRUN_CHANNEL_OFF_BEATS), 1, __ATOMIC_RELAXED);
  __atomic_store_n(field<int64_t>(page, DRUN_CHANNEL_OFF_LAST_BEAT_NS), now, __ATOMIC_RELEASE);
}

// The seqlock around the section and collective fields: odd while they change. Called with
// sectionLock held (one writer).
uint64_t lockFields(unsigned char* page) {
  uint64_t* seq = field<uint64_t>(page, DRUN_CHANNEL_OFF_SEQ);
  const uint64_t start = __atomic_load_n(seq, __ATOMIC_RELAXED) | 1;
  __atomic_store_n(seq, start, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  return start;
}

void unlockFields(unsigned char* page, uint64_t start) {
  __atomic_store_n(field<uint64_t>(page, DRUN_CHANNEL_OFF_SEQ), start + 1, __ATOMIC_RELEASE);
}

// Publishes the top of the stack (or no section). Called with sectionLock held.
void publishSection(Channel& c, bool entered) {
  unsigned char* page = c.page;
  const uint64_t start = lockFields(page);
  const Frame* top = c.depth > 0 ? &c.stack[std::min(c.depth, kMaxDepth) - 1] : nullptr;
  char* name = field<char>(page, DRUN_CHANNEL_OFF_SECTION);
  std::memset(name, 0, DRUN_CHANNEL_SECTION_MAX);
  if (top) std::memcpy(name, top->name, std::strlen(top->name));
  __atomic_store_n(field<int64_t>(page, DRUN_CHANNEL_OFF_SECTION_START_NS), top ? top->startNs : 0,
                   __ATOMIC_RELAXED);
  if (entered)
    __atomic_fetch_add(field<uint64_t>(page, DRUN_CHANNEL_OFF_SECTION_SEQ), 1, __ATOMIC_RELAXED);
  unlockFields(page, start);
}

void publishCollective(Channel& c, const char* what, int64_t now) {
  std::lock_guard<std::mutex> lock(c.sectionLock);
  const uint64_t start = lockFields(c.page);
  char* name = field<char>(c.page, DRUN_CHANNEL_OFF_COLLECTIVE);
  std::memset(name, 0, DRUN_CHANNEL_SECTION_MAX);
  if (what) copyName(name, what);
  __atomic_store_n(field<int64_t>(c.page, DRUN_CHANNEL_OFF_COLL_START_NS), what ? now : 0, __ATOMIC_RELAXED);
  unlockFields(c.page, start);
}

}  // namespace

extern "C" {

int drun_worker_enabled(void) { return channel().page != nullptr; }

void drun_worker_heartbeat(void) {
  Channel& c = channel();
  if (c.page) beat(c.page, monotonicNs());
}

void drun_worker_section_begin(const char* name) {
  Channel& c = channel();
  if (!c.page) return;
  const int64_t now = monotonicNs();
  {
    std::lock_guard<std::mutex> lock(c.sectionLock);
    if (c.depth < kMaxDepth) {
      Frame& f = c.stack[c.depth];
      copyName(f.name, name);
      f.startNs = now;
    }
    ++c.depth;
    if (c.depth <= kMaxDepth) publishSection(c, /*entered=*/true);
  }
  beat(c.page, now);
}

void drun_worker_section_end(void) {
  Channel& c = channel();
  if (!c.page) return;
  {
    std::lock_guard<std::mutex> lock(c.sectionLock);
    if (c.depth == 0) return;
    --c.depth;
    if (c.depth < kMaxDepth) publishSection(c, /*entered=*/false);
  }
  beat(c.page, monotonicNs());
}

void drun_worker_collective_begin(const char* what) {
  Channel& c = channel();
  if (!c.page) return;
  const int64_t now = monotonicNs();
  publishCollective(c, what ? what : "collective", now);
  beat(c.page, now);
}

void drun_worker_collective_end(void) {
  Channel& c = channel();
  if (!c.page) return;
  const int64_t now = monotonicNs();
  publishCollective(c, nullptr, now);
  beat(c.page, now);
}

}  // extern "C"

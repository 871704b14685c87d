#include "flight_recorder.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace drun::torch_backend {
namespace {

constexpr size_t kDefaultEntries = 256;
constexpr size_t kMaxEntries = 4096;  // what `drun trace` reads

int gSignalPipe = -1;  // the write end, for the handler
pid_t gOwner = 0;      // the process that made the recorder (a forked child shares the pipe)

void onSigusr2(int) {
  const int saved = errno;
  const char byte = 's';
  if (gSignalPipe >= 0 && ::getpid() == gOwner) (void)!::write(gSignalPipe, &byte, 1);
  errno = saved;
}

int64_t wallNs() {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int envInt(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return *end == '\0' && value >= 0 && value <= (1L << 24) ? static_cast<int>(value) : fallback;
}

// DRUN_FLIGHT_RECORD_DIR, else the attempt directory: <attempt>/<local_rank>/channel.
std::string recordDir() {
  if (const char* dir = std::getenv("DRUN_FLIGHT_RECORD_DIR"); dir != nullptr && *dir != '\0') return dir;
  const char* channel = std::getenv("DRUN_WORKER_CHANNEL");
  if (channel == nullptr || *channel == '\0') return "";
  std::string dir = channel;
  for (int up = 0; up < 2; ++up) {
    const size_t slash = dir.rfind('/');
    if (slash == std::string::npos || slash == 0) return "";
    dir.resize(slash);
  }
  return dir;
}

// "0-3" for 0,1,2,3; else "0,2,5" (cut at 64 bytes: the reader's bound on a name).
std::string membership(const std::vector<int>& ranks) {
  bool contiguous = !ranks.empty();
  for (size_t i = 1; i < ranks.size(); ++i) contiguous = contiguous && ranks[i] == ranks[i - 1] + 1;
  if (contiguous) return std::to_string(ranks.front()) + "-" + std::to_string(ranks.back());
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out.size() > 56 ? out.substr(0, 56) : out;
}

const char* stateName(int state) {
  static const char* const kNames[] = {"queued", "started", "completed", "failed"};
  return kNames[state];
}

}  // namespace

struct FlightRecorder::Impl {
  struct Entry {
    uint64_t ticket = 0;  // 0: empty slot
    std::string group;
    uint64_t seq = 0;
    std::string op, dtype;
    int64_t count = 0;
    int state = 0;  // stateName()
    int64_t queuedNs = 0, startNs = 0, endNs = 0;
  };
  struct Group {
    std::string id;
    uint64_t seq = 0;
  };

  std::mutex mutex;
  std::vector<Entry> ring;
  uint64_t nextTicket = 1;
  std::map<const void*, Group> groups;
  std::map<std::string, int> membershipsSeen;  // how many groups of that membership: "#k" ids
  std::string path;                            // "" : nothing is written
  std::string tmpPath;
  int rank = 0, worldSize = 1;
  std::mutex writeMutex;  // one writer at a time (a failure and a signal together)
  int pipe[2] = {-1, -1};
  // Its thread exists only in the process that made it: a forked child (a DataLoader worker)
  // inherits the object, not the thread, and must neither join nor signal it.
  pid_t owner = ::getpid();
  std::unique_ptr<std::thread> writerThread;  // writes the record (signal, failure); null: inline

  Entry* find(uint64_t ticket) {
    if (ticket == 0 || ring.empty()) return nullptr;
    Entry& e = ring[(ticket - 1) % ring.size()];
    return e.ticket == ticket ? &e : nullptr;  // overwritten: the ring moved on
  }

  std::string json(const char* reason) {
    std::lock_guard lock(mutex);
    std::string out = "{\"version\": 1, \"rank\": " + std::to_string(rank) + ", \"world_size\": " +
                      std::to_string(worldSize) + ", \"pid\": " + std::to_string(::getpid()) + ", \"reason\": \"" +
                      reason + "\", \"entries\": [\n  ";
    std::string entries;
    const uint64_t first = nextTicket > ring.size() ? nextTicket - ring.size() : 1;
    for (uint64_t t = first; t < nextTicket; ++t) {
      const Entry* e = find(t);
      if (!e) continue;
      entries += std::string(entries.empty() ? "" : ",\n  ") + "{\"group\": \"" + e->group + "\", \"seq\": " +
                 std::to_string(e->seq) + ", \"op\": \"" + e->op + "\", \"dtype\": \"" + e->dtype + "\", \"count\": " +
                 std::to_string(e->count) + ", \"state\": \"" + stateName(e->state) + "\", \"queued_ns\": " +
                 std::to_string(e->queuedNs) + ", \"start_ns\": " + std::to_string(e->startNs) +
                 ", \"end_ns\": " + std::to_string(e->endNs) + "}";
    }
    return out + entries + "]}\n";
  }
};

FlightRecorder& FlightRecorder::instance() {
  static FlightRecorder recorder;
  return recorder;
}

FlightRecorder::FlightRecorder() : impl_(std::make_unique<Impl>()) {
  const int entries = envInt("DRUN_FLIGHT_RECORDER_ENTRIES", static_cast<int>(kDefaultEntries));
  if (entries == 0) return;
  impl_->ring.resize(std::min<size_t>(static_cast<size_t>(entries), kMaxEntries));
  impl_->rank = envInt("RANK", 0);
  impl_->worldSize = std::max(envInt("WORLD_SIZE", 1), impl_->rank + 1);
  const std::string dir = recordDir();
  if (dir.empty()) return;
  impl_->path = dir + "/flight_record_rank" + std::to_string(impl_->rank) + ".json";
  impl_->tmpPath = impl_->path + ".tmp" + std::to_string(::getpid());
  // The recorder's thread writes the record when a byte comes through its pipe: 's' from the
  // SIGUSR2 handler, 'f' from a failed collective (whose thread goes on at once), 'q' to end.
  if (::pipe2(impl_->pipe, O_CLOEXEC | O_NONBLOCK) == 0) {
    impl_->writerThread = std::make_unique<std::thread>([this] {
      const int fd = impl_->pipe[0];
      for (;;) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, -1) < 0 && errno != EINTR) return;
        char bytes[64];
        const ssize_t n = ::read(fd, bytes, sizeof bytes);
        if (n == 0) return;
        const std::string_view got(bytes, n > 0 ? static_cast<size_t>(n) : 0);
        if (got.find('f') != std::string_view::npos) write("a collective failed");
        if (got.find('s') != std::string_view::npos) write("SIGUSR2");
        if (got.find('q') != std::string_view::npos) return;
      }
    });
  }
  // SIGUSR2 writes the record, unless the program took the signal for itself.
  struct sigaction old {};
  if (impl_->writerThread && ::sigaction(SIGUSR2, nullptr, &old) == 0 && old.sa_handler == SIG_DFL &&
      !(old.sa_flags & SA_SIGINFO)) {
    gSignalPipe = impl_->pipe[1];
    gOwner = impl_->owner;
    struct sigaction sa {};
    sa.sa_handler = onSigusr2;
    sa.sa_flags = SA_RESTART;
    ::sigemptyset(&sa.sa_mask);
    ::sigaction(SIGUSR2, &sa, nullptr);
  }
  write("started");  // the agent's sign that SIGUSR2 is safe to send
}

FlightRecorder::~FlightRecorder() {
  if (impl_->owner != ::getpid()) {
    (void)impl_->writerThread.release();  // the parent's thread: not ours to end
    return;
  }
  if (impl_->writerThread) {
    const char quit = 'q';  // after a failure's 'f' still in the pipe: that record is written first
    (void)!::write(impl_->pipe[1], &quit, 1);
    impl_->writerThread->join();
  }
  for (int fd : impl_->pipe)
    if (fd >= 0) ::close(fd);
}

uint64_t FlightRecorder::issued(const void* group, const std::vector<int>& worldRanks, const char* op,
                                const std::vector<at::Tensor>& tensors) {
  if (impl_->ring.empty()) return 0;
  int64_t count = 0;
  for (const at::Tensor& t : tensors) count += t.defined() ? t.numel() : 0;
  const std::string dtype = !tensors.empty() && tensors[0].defined() ? std::string(c10::toString(tensors[0].scalar_type())) : "none";
  std::lock_guard lock(impl_->mutex);
  auto [g, fresh] = impl_->groups.try_emplace(group);
  if (fresh) {
    const std::string members = membership(worldRanks);
    const int k = impl_->membershipsSeen[members]++;
    g->second.id = k == 0 ? members : members + "#" + std::to_string(k);
  }
  const uint64_t ticket = impl_->nextTicket++;
  Impl::Entry& e = impl_->ring[(ticket - 1) % impl_->ring.size()];
  e.ticket = ticket;
  e.group = g->second.id;
  e.seq = ++g->second.seq;
  e.op = op;
  e.dtype = dtype;
  e.count = count;
  e.state = 0;
  e.queuedNs = wallNs();
  e.startNs = e.endNs = 0;
  return ticket;
}

void FlightRecorder::started(uint64_t ticket) {
  std::lock_guard lock(impl_->mutex);
  if (Impl::Entry* e = impl_->find(ticket)) {
    e->state = 1;
    e->startNs = wallNs();
  }
}

void FlightRecorder::ended(uint64_t ticket, bool ok) {
  {
    std::lock_guard lock(impl_->mutex);
    Impl::Entry* e = impl_->find(ticket);
    if (!e) return;
    e->state = ok ? 2 : 3;
    e->endNs = wallNs();
  }
  if (ok) return;
  // The recorder's thread writes it: the collective's thread (the group's queue) goes on. A
  // full pipe already holds a byte that writes the record.
  const char failed = 'f';
  if (!impl_->writerThread || (::write(impl_->pipe[1], &failed, 1) < 0 && errno != EAGAIN)) write("a collective failed");
}

void FlightRecorder::write(const char* reason) noexcept {
  if (impl_->path.empty() || impl_->owner != ::getpid()) return;  // a forked child is not the rank
  try {
    std::lock_guard lock(impl_->writeMutex);
    const std::string text = impl_->json(reason);
    const int fd = ::open(impl_->tmpPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return;
    const bool whole = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    if (!whole || ::rename(impl_->tmpPath.c_str(), impl_->path.c_str()) != 0) ::unlink(impl_->tmpPath.c_str());
  } catch (...) {  // out of memory: no record this time
  }
}

}  // namespace drun::torch_backend

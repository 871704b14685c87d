#include "drun/agent/job_guard.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "child_reaper.hpp"
#include "drun/common/error.hpp"
#include "watchdog_notice.hpp"

namespace drun::agent {

using namespace std::chrono_literals;

namespace {

constexpr const char* kTokenVar = "DRUN_JOB_TOKEN=";
constexpr int kMaxSweepPasses = 8;
constexpr std::chrono::milliseconds kWatchdogExitBound = 2s;

// ---- The sweep: raw system calls only (it runs in the forked watchdog too) -----------------

// True when /proc/<pid>/environ holds `marker` as a whole NUL-terminated entry.
bool environHasMarker(int procFd, const char* pidName, const char* marker, size_t markerLen) {
  char path[64];
  size_t n = 0;
  while (pidName[n] && n < 40) {
    path[n] = pidName[n];
    ++n;
  }
  std::memcpy(path + n, "/environ", sizeof "/environ");
  int fd = ::openat(procFd, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // gone, or not ours to read
  char buf[8192];
  size_t pos = 0;    // bytes of the current entry seen
  bool same = true;  // the current entry matches the marker so far
  bool found = false;
  for (;;) {
    ssize_t got = ::read(fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    for (ssize_t i = 0; i < got && !found; ++i) {
      char c = buf[i];
      if (c == '\0') {
        found = same && pos == markerLen;
        pos = 0;
        same = true;
      } else if (same) {
        same = pos < markerLen && c == marker[pos];
        ++pos;
      }
    }
    if (found) break;
  }
  if (!found) found = same && pos == markerLen;  // last entry without its NUL
  ::close(fd);
  return found;
}

// One pass: SIGKILL the groups, then every marked process. Returns how many marked ones it found.
int sweepPass(const pid_t* groups, size_t groupCount, const char* marker, size_t markerLen,
              pid_t skipA, pid_t skipB) {
  for (size_t i = 0; i < groupCount; ++i)
    if (groups[i] > 1) ::kill(-groups[i], SIGKILL);
  int procFd = ::open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (procFd < 0) return 0;
  int found = 0;
  alignas(8) char buf[8192];
  for (;;) {
    long got = ::syscall(SYS_getdents64, procFd, buf, sizeof buf);
    if (got <= 0) break;
    for (long off = 0; off < got;) {
      auto* entry = reinterpret_cast<struct dirent64*>(buf + off);
      off += entry->d_reclen;
      const char* name = entry->d_name;
      pid_t pid = 0;
      bool numeric = name[0] != '\0';
      for (const char* p = name; *p && numeric; ++p) {
        numeric = *p >= '0' && *p <= '9';
        pid = pid * 10 + (*p - '0');
      }
      if (!numeric || pid <= 1 || pid == skipA || pid == skipB) continue;
      if (environHasMarker(procFd, name, marker, markerLen) && ::kill(pid, SIGKILL) == 0) ++found;
    }
  }
  ::close(procFd);
  return found;
}

// Passes until one finds no marked process (a process forked during a pass shows up in the
// next), at most kMaxSweepPasses. A process caught inside execve shows no environment for a
// moment, so a pass that found nothing is confirmed by a second one, at once: the common case
// (nothing left) costs two scans and no sleep.
void sweepJob(const pid_t* groups, size_t groupCount, const char* marker, size_t markerLen,
              pid_t skipA, pid_t skipB) {
  bool clean = false;
  for (int pass = 0; pass < kMaxSweepPasses; ++pass) {
    if (sweepPass(groups, groupCount, marker, markerLen, skipA, skipB) == 0) {
      if (clean) return;
      clean = true;
      continue;
    }
    clean = false;
    timespec nap{0, 1'000'000};  // let the killed ones die and release their environment
    ::nanosleep(&nap, nullptr);
  }
}

// ---- The watchdog process ---------------------------------------------------------------------

constexpr size_t kWatchdogMaxGroups = 4096;  // beyond that the marker scan still finds them
pid_t gWatchdogGroups[kWatchdogMaxGroups];   // only touched in the forked watchdog
char gWatchdogLine[detail::kNoticeMaxLine];  // the longest line: a death notice's request

[[noreturn]] void watchdogMain(int fd, pid_t drunPid, const char* marker, size_t markerLen) {
  ::setpgid(0,
            0);  // out of drun's group: a signal to drun's group (Ctrl-C, kill -9 -pgid) misses it
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    sa.sa_handler =
        (sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT || sig == SIGPIPE)
            ? SIG_IGN
            : SIG_DFL;
    ::sigaction(sig, &sa, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (fd > 0) ::syscall(SYS_close_range, 0u, static_cast<unsigned>(fd - 1), 0u);
  ::syscall(SYS_close_range, static_cast<unsigned>(fd + 1), ~0u, 0u);
  ::prctl(PR_SET_NAME, "drun-watchdog", 0, 0, 0);

  size_t groupCount = 0;
  char* line = gWatchdogLine;
  size_t lineLen = 0;
  char buf[4096];
  bool sweep = false;
  while (!sweep) {
    ssize_t got = ::read(fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // EOF: drun exited or died
    for (ssize_t i = 0; i < got && !sweep; ++i) {
      if (buf[i] != '\n') {
        if (lineLen < sizeof gWatchdogLine) line[lineLen++] = buf[i];
        continue;
      }
      if (lineLen >= 1 && lineLen < sizeof gWatchdogLine && line[0] == 'n') {
        detail::takeNoticeLine(line + 1, lineLen - 1);
      } else if (lineLen == 5 && std::memcmp(line, "sweep", 5) == 0) {
        sweep = true;
      } else if (lineLen == 4 && std::memcmp(line, "quit", 4) == 0) {
        _exit(0);  // drun proved nothing of the job is left (see JobGuard::release)
      } else if (lineLen >= 2 && lineLen < 64 && (line[0] == '+' || line[0] == '-')) {
        pid_t pgid = 0;
        bool ok = true;
        for (size_t k = 1; k < lineLen && ok; ++k) {
          ok = line[k] >= '0' && line[k] <= '9';
          pgid = pgid * 10 + (line[k] - '0');
        }
        if (ok && pgid > 1) {
          if (line[0] == '+') {
            if (groupCount < kWatchdogMaxGroups) gWatchdogGroups[groupCount++] = pgid;
          } else {
            for (size_t k = 0; k < groupCount; ++k)
              if (gWatchdogGroups[k] == pgid) {
                gWatchdogGroups[k] = gWatchdogGroups[--groupCount];
                break;
              }
          }
        }
      }
      lineLen = 0;
    }
  }
  sweepJob(gWatchdogGroups, groupCount, marker, markerLen, ::getpid(), drunPid);
  // drun is gone (EOF without a release: a live drun withdraws its notice first): its notice
  // goes now, after its workers, so none of them runs on once the others see this node gone.
  if (!sweep) detail::sendHeldNotice();
  _exit(0);
}

std::string randomToken() {
  unsigned char bytes[16];
  size_t have = 0;
  while (have < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + have, sizeof bytes - have, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(std::string("getrandom failed: ") + std::strerror(errno));
    have += static_cast<size_t>(n);
  }
  return detail::toHex(bytes, sizeof bytes);
}

}  // namespace

JobGuard JobGuard::start() {
  JobGuard guard;
  // Orphaned descendants re-parent to drun (and are reaped by WorkerGroup), not to init.
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
    spdlog::debug("PR_SET_CHILD_SUBREAPER failed: {}", std::strerror(errno));
  guard.token_ = randomToken();
  guard.spawnWatchdog();
  return guard;
}

void JobGuard::spawnWatchdog() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    throw Error(std::string("job guard: socketpair failed: ") + std::strerror(errno));
  std::string marker = envEntry();  // prepared before fork: the child does not allocate
  pid_t drunPid = ::getpid();
  int forkErrno = 0;
  // Terminal signals stay blocked until the watchdog ignores them, so none is lost on it early.
  sigset_t terminal, oldMask;
  sigemptyset(&terminal);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) sigaddset(&terminal, sig);
  ::pthread_sigmask(SIG_BLOCK, &terminal, &oldMask);
  pid_t pid = detail::ChildReaper::instance().spawnWatched(
      [&] {
        pid_t child = ::fork();
        if (child == 0) {
          ::close(fds[0]);
          watchdogMain(fds[1], drunPid, marker.c_str(), marker.size());
        }
        forkErrno = errno;
        if (child > 0) ::setpgid(child, child);  // as the child does: no window in drun's group
        return child;
      },
      nullptr);  // its status interests nobody; release() collects it
  ::pthread_sigmask(SIG_SETMASK, &oldMask, nullptr);
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    throw Error(std::string("job guard: fork of the watchdog failed: ") + std::strerror(forkErrno));
  }
  writeFd_ = fds[0];
  watchdogPid_ = pid;
  spdlog::debug("job guard: watchdog pid {}", pid);
  attachNotice();
}

// The process's death notice goes to the watchdog now and at every change, from whichever thread
// publishes it: through a descriptor of its own (a line of the notice is one send, whole).
void JobGuard::attachNotice() {
  noticeFd_ = ::fcntl(writeFd_, F_DUPFD_CLOEXEC, 0);
  if (noticeFd_ < 0) {
    spdlog::warn("job guard: no death notice ({}): a lost node is seen at its lease's end", std::strerror(errno));
    return;
  }
  followNotice();
}

void JobGuard::followNotice() {
  onDeathNotice([fd = noticeFd_](const std::optional<DeathNotice>& notice) {
    const std::string lines = detail::noticeLines(notice);
    ssize_t n;
    do n = ::send(fd, lines.data(), lines.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n != static_cast<ssize_t>(lines.size()))
      spdlog::debug("job guard: the death notice did not reach the watchdog ({})", n < 0 ? std::strerror(errno) : "short write");
  });
}

// A live drun's notice is withdrawn (it ends its lease itself), before the watchdog sees EOF.
void JobGuard::detachNotice(bool withdraw) {
  if (noticeFd_ < 0) return;
  onDeathNotice(nullptr);
  if (withdraw) ::send(noticeFd_, "n-\n", 3, MSG_NOSIGNAL | MSG_DONTWAIT);
  ::close(noticeFd_);
  noticeFd_ = -1;
}

void JobGuard::notify(const std::string& line) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (writeFd_ < 0) return;  // released
    ssize_t n;
    do n = ::send(writeFd_, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n == static_cast<ssize_t>(line.size())) return;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // The watchdog is not reading (stopped?): never block drun; the marker scan still covers.
      spdlog::warn("job guard: watchdog pid {} is not reading; '{}' dropped", watchdogPid_,
                   line.substr(0, line.size() - 1));
      return;
    }
    // EPIPE/ECONNRESET: the watchdog died (killed by someone). Fork a new one, replay, resend.
    spdlog::warn("job guard: watchdog pid {} is gone ({}); starting a new one", watchdogPid_,
                 n < 0 ? std::strerror(errno) : "short write");
    detachNotice(false);
    ::close(writeFd_);
    writeFd_ = -1;
    detail::ChildReaper::instance().reapWithin(watchdogPid_, 100ms);
    watchdogPid_ = -1;
    try {
      spawnWatchdog();
    } catch (const std::exception& e) {
      spdlog::error("{}", e.what());
      return;
    }
    for (pid_t pgid : groups_) {
      std::string replay = "+" + std::to_string(pgid) + "\n";
      if (replay != line)
        ::send(writeFd_, replay.data(), replay.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  }
}

JobGuard::JobGuard(JobGuard&& other) noexcept
    : token_(std::move(other.token_)),
      writeFd_(std::exchange(other.writeFd_, -1)),
      watchdogPid_(std::exchange(other.watchdogPid_, -1)),
      noticeFd_(std::exchange(other.noticeFd_, -1)),
      groups_(std::move(other.groups_)) {}

JobGuard& JobGuard::operator=(JobGuard&& other) noexcept {
  if (this != &other) {
    release();
    token_ = std::move(other.token_);
    writeFd_ = std::exchange(other.writeFd_, -1);
    watchdogPid_ = std::exchange(other.watchdogPid_, -1);
    noticeFd_ = std::exchange(other.noticeFd_, -1);
    groups_ = std::move(other.groups_);
    if (noticeFd_ >= 0) followNotice();  // release() above let the process's notice go
  }
  return *this;
}

JobGuard::~JobGuard() { release(); }

// drun is a child subreaper: every descendant whose parent died was re-parented to it. So when
// drun's only child left is the watchdog, no process of the job is alive and the /proc sweep
// can be skipped (it costs milliseconds of every job's exit).
static bool onlyChildIs(pid_t watchdog) {
  DIR* tasks = ::opendir("/proc/self/task");
  if (!tasks) return false;
  bool only = true;
  while (dirent* task = ::readdir(tasks)) {
    if (task->d_name[0] == '.') continue;
    std::string path = std::string("/proc/self/task/") + task->d_name + "/children";
    std::ifstream in(path);
    if (!in) {
      only = false;
      break;
    }
    pid_t child = 0;
    while (in >> child)
      if (child != watchdog) only = false;
  }
  ::closedir(tasks);
  return only;
}

void JobGuard::release() {
  detachNotice(true);
  if (writeFd_ >= 0) {
    if (groups_.empty() && watchdogPid_ > 0 && onlyChildIs(watchdogPid_)) notify("quit\n");
    ::close(writeFd_);  // EOF: the watchdog sweeps and exits
    writeFd_ = -1;
  }
  if (watchdogPid_ > 0) {
    auto& reaper = detail::ChildReaper::instance();
    if (!reaper.reapWithin(watchdogPid_, kWatchdogExitBound)) {
      spdlog::warn("job guard: watchdog pid {} did not finish its sweep within {}ms; killed",
                   watchdogPid_, kWatchdogExitBound.count());
      ::kill(watchdogPid_, SIGKILL);
      if (!reaper.reapWithin(watchdogPid_, 500ms)) reaper.forget(watchdogPid_);
    }
    watchdogPid_ = -1;
  }
}

std::string JobGuard::envEntry() const { return kTokenVar + token_; }

void JobGuard::addProcessGroup(pid_t pgid) {
  if (pgid <= 1) return;
  groups_.push_back(pgid);
  notify("+" + std::to_string(pgid) + "\n");
}

void JobGuard::removeProcessGroup(pid_t pgid) {
  auto it = std::find(groups_.begin(), groups_.end(), pgid);
  if (it == groups_.end()) return;
  groups_.erase(it);
  notify("-" + std::to_string(pgid) + "\n");
}

void JobGuard::sweep() {
  if (token_.empty()) return;  // moved from
  std::string marker = envEntry();
  sweepJob(groups_.data(), groups_.size(), marker.c_str(), marker.size(), ::getpid(), watchdogPid_);
}

}  // namespace drun::agent

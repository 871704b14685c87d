#include "process_spawn.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

// Sanitizer builds spawn with fork() (see below); DRUN_SPAWN_WITH_FORK=1 forces it elsewhere.
#ifndef DRUN_SPAWN_WITH_FORK
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DRUN_SPAWN_WITH_FORK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define DRUN_SPAWN_WITH_FORK 1
#endif
#endif
#endif
#ifndef DRUN_SPAWN_WITH_FORK
#define DRUN_SPAWN_WITH_FORK 0
#endif

namespace drun::agent::detail {
namespace {

// The kernel's sigset size (glibc's sigset_t is larger).
constexpr size_t kKernelSigsetBytes = _NSIG / 8;
constexpr size_t kChildStackBytes = 32 * 1024;
constexpr int kMpolBind = 2;  // <linux/mempolicy.h>'s MPOL_BIND: allocate on these nodes only

// The kernel's struct sigaction for rt_sigaction (glibc's has another layout).
struct KernelSigaction {
  void* handler;
  unsigned long flags;
  void* restorer;
  unsigned long mask;
};

struct ChildArgs {
  const unsigned long* cpuMask;  // sched_setaffinity's mask; nullptr: not bound
  size_t cpuMaskBytes;
  const unsigned long* memMask;  // set_mempolicy's node mask; nullptr: not bound
  unsigned long memMaskBits;
  const char* path;
  char* const* argv;
  char* const* envp;
  int fds[3];
  pid_t parent;
  int reportFd;  // fork path: a failure is written here (>= 3, close-on-exec); clone path: -1
  int error;     // clone path: written by the child on failure (shared memory)
  const char* step;
};

// What a forked child writes on failure. `step` points at a string literal, which is at the
// same address in the parent (fork copies the address space).
struct FailureReport {
  int error;
  const char* step;
};

[[noreturn]] void childFail(ChildArgs* a, const char* step) {
  a->error = errno;
  a->step = step;
  if (a->reportFd >= 0) {
    const FailureReport report{a->error, step};
    (void)!::write(a->reportFd, &report, sizeof report);
  }
  _exit(a->error == ENOENT || a->error == ENOTDIR ? 127 : 126);
}

// The open-file limit drun started with (raiseOpenFileLimit()), given back to each worker.
struct rlimit gWorkerOpenFiles {};
bool gRestoreOpenFiles = false;

// Runs in the child: on a borrowed stack sharing the parent's memory (clone path), or in a fork
// (sanitizer builds). Raw system calls only.
int childMain(void* arg) {
  auto* a = static_cast<ChildArgs*>(arg);
  if (::setpgid(0, 0) != 0) childFail(a, "setpgid");
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) childFail(a, "prctl");
  if (::getppid() != a->parent) _exit(127);  // the parent died before the death signal was armed

  // Handlers would run the parent's code on this stack, and SIG_IGN survives execve: reset all.
  KernelSigaction dfl{};  // SIG_DFL, no flags, empty mask
  for (int sig = 1; sig < _NSIG; ++sig) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    ::syscall(SYS_rt_sigaction, sig, &dfl, nullptr, kKernelSigsetBytes);  // errors: not settable
  }

  for (int target = 0; target < 3; ++target) {
    int fd = a->fds[target];
    if (fd == target) {
      if (::fcntl(fd, F_SETFD, 0) != 0) childFail(a, "fcntl");  // keep it across execve
    } else if (::dup2(fd, target) < 0) {
      childFail(a, "dup2");
    }
  }
  // Workers inherit nothing else of drun's (nor of what drun inherited), as Python's close_fds.
  // The fork path's report pipe must stay open until execve: there every fd is marked
  // close-on-exec instead (CLOSE_RANGE_CLOEXEC).
  constexpr unsigned kCloseRangeCloexec = 4;
  if (::syscall(SYS_close_range, 3u, ~0u, a->reportFd >= 0 ? kCloseRangeCloexec : 0u) != 0) {
    // Kernel < 5.9: every fd drun opens itself is O_CLOEXEC, so nothing leaks from drun.
  }

  if (gRestoreOpenFiles) ::syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, &gWorkerOpenFiles, nullptr);

  // --numa-binding: both survive execve. The memory policy is best effort (seccomp in a
  // container may refuse set_mempolicy); the CPUs were checked against drun's own.
  if (a->cpuMask && ::syscall(SYS_sched_setaffinity, 0, a->cpuMaskBytes, a->cpuMask) != 0)
    childFail(a, "sched_setaffinity");
  if (a->memMask) ::syscall(SYS_set_mempolicy, kMpolBind, a->memMask, a->memMaskBits + 1);

  sigset_t empty;
  sigemptyset(&empty);
  ::syscall(SYS_rt_sigprocmask, SIG_SETMASK, &empty, nullptr, kKernelSigsetBytes);
  ::execve(a->path, a->argv, a->envp);
  childFail(a, "execve");
}

// The kernel's bit mask of `bits` (CPU or node numbers), in unsigned longs; empty for none.
std::vector<unsigned long> kernelMask(const std::vector<int>& bits) {
  constexpr int kWordBits = 8 * sizeof(unsigned long);
  std::vector<unsigned long> mask;
  for (int bit : bits) {
    if (bit < 0) continue;
    if (mask.size() <= static_cast<size_t>(bit / kWordBits)) mask.resize(bit / kWordBits + 1, 0);
    mask[bit / kWordBits] |= 1UL << (bit % kWordBits);
  }
  return mask;
}

std::vector<char*> cStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

SpawnResult spawnProcess(const SpawnRequest& request) {
  std::vector<char*> argv = cStrings(request.argv);
  std::vector<char*> envp = cStrings(request.env);
  const std::vector<unsigned long> cpuMask = kernelMask(request.binding.cpus);
  const std::vector<unsigned long> memMask = kernelMask(request.binding.memNodes);
  ChildArgs args{};
  args.cpuMask = cpuMask.empty() ? nullptr : cpuMask.data();
  args.cpuMaskBytes = cpuMask.size() * sizeof(unsigned long);
  args.memMask = memMask.empty() ? nullptr : memMask.data();
  args.memMaskBits = memMask.size() * 8 * sizeof(unsigned long);
  args.path = request.path.c_str();
  args.argv = argv.data();
  args.envp = envp.data();
  args.fds[0] = request.stdinFd;
  args.fds[1] = request.stdoutFd;
  args.fds[2] = request.stderrFd;
  args.parent = ::getpid();
  args.reportFd = -1;
  args.error = 0;
  args.step = "";
  SpawnResult result;

#if DRUN_SPAWN_WITH_FORK
  // Sanitizer builds (ASan, TSan) cannot follow a child running on a borrowed stack in the
  // parent's memory: the child is a fork() running the same steps, and it reports a failed step
  // through a close-on-exec pipe (EOF: execve succeeded).
  int reportPipe[2];
  if (::pipe2(reportPipe, O_CLOEXEC) != 0) {
    result.error = errno;
    result.step = "pipe2";
    return result;
  }
  args.reportFd = ::fcntl(reportPipe[1], F_DUPFD_CLOEXEC, 3);  // clear of the stdio targets
  ::close(reportPipe[1]);
#endif

  sigset_t all, old;
  sigfillset(&all);
  ::syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, &old, kKernelSigsetBytes);
#if DRUN_SPAWN_WITH_FORK
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(reportPipe[0]);
    childMain(&args);
  }
#else
  // The child runs on this array while we are suspended (CLONE_VFORK): our frame stays intact.
  alignas(64) char stack[kChildStackBytes];
  pid_t pid = ::clone(childMain, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
#endif
  const int spawnErrno = errno;
  ::syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old, nullptr, kKernelSigsetBytes);

#if DRUN_SPAWN_WITH_FORK
  ::close(args.reportFd);
  // The child does nothing that can block before execve or its report.
  FailureReport report{};
  ssize_t n;
  do n = pid > 0 ? ::read(reportPipe[0], &report, sizeof report) : 0;
  while (n < 0 && errno == EINTR);
  ::close(reportPipe[0]);
  if (n == static_cast<ssize_t>(sizeof report)) {
    args.error = report.error;
    args.step = report.step;
  }
#endif
  result.pid = pid;
  if (pid < 0) {
    result.error = spawnErrno;
    result.step = DRUN_SPAWN_WITH_FORK ? "fork" : "clone";
    return result;
  }
  result.error = args.error;
  result.step = args.step;
  return result;
}

std::string resolveProgram(const std::string& name, const std::vector<std::string>& env,
                           int* error) {
  *error = 0;
  if (name.find('/') != std::string::npos) return name;
  if (name.empty()) {
    *error = ENOENT;
    return {};
  }
  std::string path;
  bool found = false;
  for (const auto& entry : env) {
    if (entry.rfind("PATH=", 0) == 0) {
      path = entry.substr(5);
      found = true;
    }
  }
  if (!found) {
    const char* own = std::getenv("PATH");
    path = own ? own : "/usr/local/bin:/usr/bin:/bin";
  }
  std::string notExecutable;
  size_t begin = 0;
  for (;;) {
    size_t end = path.find(':', begin);
    std::string dir =
        path.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
      if (notExecutable.empty()) notExecutable = candidate;
    }
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  *error = notExecutable.empty() ? ENOENT : EACCES;
  return notExecutable;
}

void raiseOpenFileLimit() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  const struct rlimit started = limit;
  limit.rlim_cur = limit.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  gWorkerOpenFiles = started;
  gRestoreOpenFiles = true;
}

}  // namespace drun::agent::detail

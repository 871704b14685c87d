#include "process_spawn.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
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

// The kernel's struct sigaction for rt_sigaction (glibc's has another layout).
struct KernelSigaction {
  void* handler;
  unsigned long flags;
  void* restorer;
  unsigned long mask;
};

struct ChildArgs {
  const char* path;
  char* const* argv;
  char* const* envp;
  int fds[3];
  pid_t parent;
  int error;  // written by the child on failure (shared memory)
  const char* step;
};

[[noreturn, maybe_unused]] void childFail(ChildArgs* a, const char* step) {
  a->error = errno;
  a->step = step;
  _exit(a->error == ENOENT || a->error == ENOTDIR ? 127 : 126);
}

// Runs in the child, on a borrowed stack, sharing the parent's memory: raw system calls only.
[[maybe_unused]] int childMain(void* arg) {
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
  if (::syscall(SYS_close_range, 3u, ~0u, 0u) != 0) {
    // Kernel < 5.9: every fd drun opens itself is O_CLOEXEC, so nothing leaks from drun.
  }

  sigset_t empty;
  sigemptyset(&empty);
  ::syscall(SYS_rt_sigprocmask, SIG_SETMASK, &empty, nullptr, kKernelSigsetBytes);
  ::execve(a->path, a->argv, a->envp);
  childFail(a, "execve");
}

std::vector<char*> cStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

}  // namespace

#if DRUN_SPAWN_WITH_FORK
// Sanitizer builds (ASan, TSan) cannot run a child on a borrowed stack in the parent's memory:
// they track stacks and threads. There the child is a fork() running the same steps, and it
// reports a failed step through a close-on-exec pipe instead of shared memory.
SpawnResult spawnProcess(const SpawnRequest& request) {
  std::vector<char*> argv = cStrings(request.argv);
  std::vector<char*> envp = cStrings(request.env);
  ChildArgs args{};
  args.path = request.path.c_str();
  args.argv = argv.data();
  args.envp = envp.data();
  args.fds[0] = request.stdinFd;
  args.fds[1] = request.stdoutFd;
  args.fds[2] = request.stderrFd;
  args.parent = ::getpid();
  int report[2];
  SpawnResult result;
  if (::pipe2(report, O_CLOEXEC) != 0) {
    result.error = errno;
    result.step = "pipe2";
    return result;
  }
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t pid = ::fork();
  if (pid == 0) {
    // childMain's steps; a failure is written to the pipe (errno, then the step's name).
    args.error = 0;
    ::close(report[0]);
    if (report[1] <= 2) {  // keep the report fd clear of the stdio targets
      int moved = ::fcntl(report[1], F_DUPFD_CLOEXEC, 3);
      report[1] = moved;
    }
    ChildArgs* a = &args;
    auto fail = [&](const char* step) {
      const int error = errno;
      char buf[64];
      const int n = std::snprintf(buf, sizeof buf, "%d %s", error, step);
      (void)!::write(report[1], buf, static_cast<size_t>(n));
      _exit(error == ENOENT || error == ENOTDIR ? 127 : 126);
    };
    if (::setpgid(0, 0) != 0) fail("setpgid");
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail("prctl");
    if (::getppid() != a->parent) _exit(127);
    for (int sig = 1; sig < _NSIG; ++sig)
      if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
    for (int target = 0; target < 3; ++target) {
      int fd = a->fds[target];
      if (fd == target) {
        if (::fcntl(fd, F_SETFD, 0) != 0) fail("fcntl");
      } else if (::dup2(fd, target) < 0) {
        fail("dup2");
      }
    }
    // Every fd from 3 up is close-on-exec'd rather than closed: the report pipe must stay open
    // until execve succeeds.
    ::syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */);
    sigset_t empty;
    sigemptyset(&empty);
    ::pthread_sigmask(SIG_SETMASK, &empty, nullptr);
    ::execve(a->path, a->argv, a->envp);
    fail("execve");
  }
  const int forkErrno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ::close(report[1]);
  result.pid = pid;
  if (pid < 0) {
    ::close(report[0]);
    result.error = forkErrno;
    result.step = "fork";
    return result;
  }
  // EOF at execve (close-on-exec) or the failure report: the child does nothing that can block.
  char buf[64] = {};
  ssize_t n;
  do n = ::read(report[0], buf, sizeof buf - 1);
  while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (n > 0) {
    static const char* const kSteps[] = {"setpgid", "prctl", "fcntl", "dup2", "execve"};
    int error = 0;
    char step[32] = {};
    if (std::sscanf(buf, "%d %31s", &error, step) == 2) {
      result.error = error;
      for (const char* known : kSteps)
        if (std::strcmp(step, known) == 0) result.step = known;
    }
  }
  return result;
}
#else
SpawnResult spawnProcess(const SpawnRequest& request) {
  std::vector<char*> argv = cStrings(request.argv);
  std::vector<char*> envp = cStrings(request.env);
  ChildArgs args{};
  args.path = request.path.c_str();
  args.argv = argv.data();
  args.envp = envp.data();
  args.fds[0] = request.stdinFd;
  args.fds[1] = request.stdoutFd;
  args.fds[2] = request.stderrFd;
  args.parent = ::getpid();
  args.error = 0;
  args.step = "";

  // The child runs on this array while we are suspended (CLONE_VFORK): our frame stays intact.
  alignas(64) char stack[kChildStackBytes];

  sigset_t all, old;
  sigfillset(&all);
  ::syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, &old, kKernelSigsetBytes);
  pid_t pid = ::clone(childMain, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
  int cloneErrno = errno;
  ::syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old, nullptr, kKernelSigsetBytes);

  SpawnResult result;
  result.pid = pid;
  if (pid < 0) {
    result.error = cloneErrno;
    result.step = "clone";
    return result;
  }
  result.error = args.error;
  result.step = args.step;
  return result;
}
#endif

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

}  // namespace drun::agent::detail

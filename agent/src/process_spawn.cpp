#include "process_spawn.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

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

[[noreturn]] void childFail(ChildArgs* a, const char* step) {
  a->error = errno;
  a->step = step;
  _exit(a->error == ENOENT || a->error == ENOTDIR ? 127 : 126);
}

// Runs in the child, on a borrowed stack, sharing the parent's memory: raw system calls only.
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

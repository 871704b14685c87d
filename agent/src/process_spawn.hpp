// Process spawning for WorkerGroup: clone(CLONE_VM | CLONE_VFORK) + execve, the way posix_spawn
// does it, plus what posix_spawn cannot do: the parent-death signal and its race check.
//
// The child: own process group, PR_SET_PDEATHSIG(SIGKILL) (exits at once if the parent is already
// gone), every signal disposition back to SIG_DFL and an empty signal mask, stdin/stdout/stderr
// from the given fds, every other fd closed, its CPU and memory binding when given, then execve. It shares the parent's memory until
// execve (the parent is suspended meanwhile), so it only makes raw system calls and reports an
// exec failure through that shared memory: the result carries the errno and the child has
// _exit()ed with 127 (ENOENT, ENOTDIR) or 126 (anything else), like a shell.
//
// Sanitizer builds (ASan, TSan; or -DDRUN_SPAWN_WITH_FORK=1) take a fork() path with the same
// steps, reporting a failed step through a close-on-exec pipe: sanitizers cannot follow a child
// running on a borrowed stack in the parent's memory. agent_tests pass on both paths.
//
// Threading: any thread; spawnProcess() blocks every signal of the calling thread around clone()
// so no handler runs on the child's borrowed stack. Ownership: fds stay owned by the caller.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "drun/agent/numa_binding.hpp"

namespace drun::agent::detail {

struct SpawnRequest {
  std::string path;               // executable to execve ("" = not found)
  std::vector<std::string> argv;  // argv[0] as the program will see it
  std::vector<std::string> env;   // complete environment, "KEY=VALUE"
  int stdinFd = -1;
  int stdoutFd = -1;
  int stderrFd = -1;
  // Set in the child before execve (both survive it): the CPU affinity (sched_setaffinity; a
  // failure fails the spawn, step "sched_setaffinity") and the memory policy, MPOL_BIND to
  // memNodes (set_mempolicy; best effort: a container may refuse it). Empty: left as drun's.
  RankBinding binding;
};

struct SpawnResult {
  pid_t pid = -1;         // the child, or -1 when clone() failed (then `error` is its errno)
  int error = 0;          // errno of the failed step in the child (0 = execve succeeded)
  const char* step = "";  // the failed step: "execve", "setpgid", "dup2", ...
};

SpawnResult spawnProcess(const SpawnRequest& request);

// Raises drun's soft RLIMIT_NOFILE to its hard limit (drun holds pipes for every worker:
// `ulimit -n 64` would end a large job in "Too many open files"); workers spawned afterwards get
// the soft limit drun started with, as the user set it. Call once, before spawning.
void raiseOpenFileLimit();

// argv[0] as given when it contains '/'; else the first executable regular file named so in the
// PATH of `env` (drun's own PATH when `env` has none). Not found: "" with *error = ENOENT, or the
// non-executable candidate with *error = EACCES.
std::string resolveProgram(const std::string& name, const std::vector<std::string>& env,
                           int* error);

}  // namespace drun::agent::detail

#include "orphan_sweep.hpp"

#include <dirent.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "child_reaper.hpp"

namespace drun::agent::detail {

namespace {

// The parent of `pid` from /proc/<pid>/stat ("pid (comm) state ppid ..."; comm may hold spaces
// and parentheses, so parse after the last ')'). 0 when it is gone or a zombie (nothing to kill;
// the reaper collects it).
pid_t parentOf(const char* pidName) {
  std::ifstream in(std::string("/proc/") + pidName + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return 0;
  auto close = stat.rfind(')');
  if (close == std::string::npos || close + 4 >= stat.size() || stat[close + 2] == 'Z') return 0;
  return static_cast<pid_t>(std::strtol(stat.c_str() + close + 4, nullptr, 10));
}

// Every live process descended from this one, except `keep` and its descendants.
std::vector<pid_t> descendants(pid_t keep) {
  std::unordered_map<pid_t, pid_t> parent;
  if (DIR* proc = ::opendir("/proc")) {
    while (dirent* entry = ::readdir(proc)) {
      char* end = nullptr;
      long pid = std::strtol(entry->d_name, &end, 10);
      if (pid <= 1 || *end != '\0') continue;
      if (pid_t ppid = parentOf(entry->d_name)) parent[static_cast<pid_t>(pid)] = ppid;
    }
    ::closedir(proc);
  }
  const pid_t self = ::getpid();
  std::vector<pid_t> out;
  for (const auto& [pid, ppid] : parent) {
    // Walk up (bounded: a pid reused mid-scan could make a cycle).
    pid_t at = pid;
    for (int depth = 0; depth < 64 && at > 1 && at != self && at != keep; ++depth) {
      auto it = parent.find(at);
      at = it == parent.end() ? 0 : it->second;
    }
    if (at == self && pid != self && pid != keep) out.push_back(pid);
  }
  return out;
}

}  // namespace

int killReparentedDescendants(pid_t keep, std::chrono::milliseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  int killed = 0;
  for (;;) {
    std::vector<pid_t> left = descendants(keep);
    ChildReaper::instance().reapAll();
    if (left.empty()) break;
    for (pid_t pid : left) killed += ::kill(pid, SIGKILL) == 0;
    if (std::chrono::steady_clock::now() >= deadline) {
      spdlog::warn("{} descendant process(es) of drun still there at exit", left.size());
      break;
    }
    timespec nap{0, 1'000'000};  // let the killed die (zombies: reaped on the next pass)
    ::nanosleep(&nap, nullptr);
  }
  if (killed) spdlog::debug("agent: killed {} re-parented descendant(s) at the end of the job", killed);
  return killed;
}

}  // namespace drun::agent::detail

// IdleProbe: the zero-code side of hang detection (--hang-idle). Samples, from /proc, what the
// thread that runs the program does in every process of each worker's process group: the main
// thread's (tid == pid) CPU time (utime + stime, with the process's reaped children's), bytes
// written (wchar) and wait channel; a rank whose sample did not change is idle since the last
// change. Helper threads are left out: a torch rank waiting in a collective keeps its
// transport's and watchdog's threads busy, and is idle all the same.
//
// Threading: not thread-safe; the agent's loop owns it. Reads /proc only (no blocking calls:
// procfs reads do not wait on anything the workers control).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <vector>

namespace drun::agent::detail {

class IdleProbe {
 public:
  // Samples every process group in `groups` (the workers' pids = their process group ids) at
  // `nowNs`; returns for each how long (ns) its activity has not changed.
  std::vector<int64_t> sample(const std::vector<pid_t>& groups, int64_t nowNs);

 private:
  struct Seen {
    uint64_t activity = 0;
    int64_t changedNs = 0;
    bool known = false;
  };
  std::map<pid_t, Seen> seen_;
};

}  // namespace drun::agent::detail

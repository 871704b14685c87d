// IdleProbe: the zero-code side of hang detection (--hang-idle). Samples, from /proc, the CPU
// time (utime + stime, with reaped children's) and the bytes written (wchar) of every process in
// each worker's process group; a rank whose sample did not change is idle since the last change.
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

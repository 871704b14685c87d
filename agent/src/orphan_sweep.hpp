// killReparentedDescendants(): no daemon of the job outlives drun. A worker's daemon
// that leaves its process group (setsid + double fork) and clears its environment (env -i) is
// found neither by the group kill nor by the job guard's marker; but drun is a child subreaper,
// so once its parent exits it is drun's child. At the end of the job drun SIGKILLs every process
// descended from it except `keep` (the job guard's watchdog) and what descends from that, reaps
// them, and repeats (a killed daemon's children re-parent to drun in turn) until none is left or
// `bound` passed. After a SIGKILL of drun itself the job guard's sweep is what remains.
//
// Threading: the agent's thread, after the workers were reaped. Reaping goes through
// ChildReaper (orphans' statuses are dropped).
#pragma once

#include <sys/types.h>

#include <chrono>

namespace drun::agent::detail {

// Returns how many processes it killed.
int killReparentedDescendants(pid_t keep, std::chrono::milliseconds bound);

}  // namespace drun::agent::detail

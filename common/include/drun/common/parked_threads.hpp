// parkUntilExit(): the owner of threads whose first owner cannot wait for them. An object that
// lives on an event loop (a membership watcher of a finished round) or a call with a deadline (a
// name lookup that did not answer in time) stops its thread and hands it here instead of
// joining it. Each park joins the parked threads that have ended since; at exit (static
// destruction) the rest are joined, all of them within kExitBound together, and any still
// blocked then is left as OwnedThread::join leaves it (a debug log line, detached).
//
// Threading: any thread. Ownership: a process-wide list, created on first use.
#pragma once

#include <chrono>

#include "drun/common/owned_thread.hpp"

namespace drun {

inline constexpr std::chrono::milliseconds kParkedThreadsExitBound{2000};

// Takes `thread` (its owner has told it to stop).
void parkUntilExit(OwnedThread thread);

}  // namespace drun

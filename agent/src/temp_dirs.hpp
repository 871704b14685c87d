// The temporary job directories drun makes ($TMPDIR/drun_XXXXXX, for the workers' error files
// when there is no --log-dir) and their cleanup after a drun that was SIGKILLed.
//
// A running drun holds an exclusive flock on its directory (the job guard's watchdog, forked
// earlier, does not share it; workers never inherit it: close-on-exec). So a directory of that
// name whose lock is free, that holds nothing but empty directories and that was not modified
// for a few seconds belongs to nobody: a drun that could not remove it (SIGKILL). Each start
// removes its predecessors' such trees; a tree holding a file (an error file of a failed run,
// someone else's data) is left alone.
//
// Threading: the agent's thread. Ownership: lockTempDir() returns an fd the caller closes (at
// exit, after removing the directory).
#pragma once

#include <chrono>
#include <filesystem>

namespace drun::agent::detail {

// Opens `dir` and takes its lock; -1 when that fails (the directory works without it).
int lockTempDir(const std::filesystem::path& dir);

// Removes the abandoned drun_XXXXXX trees under `parent` (see above). Returns how many.
int removeAbandonedTempDirs(const std::filesystem::path& parent,
                            std::chrono::seconds quietFor = std::chrono::seconds(5));

}  // namespace drun::agent::detail

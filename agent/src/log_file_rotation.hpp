// rotateLogFile(): one step of a worker log file's rotation (LogRotation), on the log file
// writer's thread: it blocks on the file system as the writes do, never on the loop.
#pragma once

#include <string>

namespace drun::agent::detail {

// Shifts NAME.1..NAME.<keep-1> to NAME.2..NAME.<keep> (dropping the old NAME.<keep>), renames NAME
// to NAME.1 and replaces `fd` (open on NAME) by a new, empty NAME; with keep 0, empties NAME in
// place. Returns 0 or the errno of the step that failed (then `fd` still writes somewhere valid).
int rotateLogFile(const std::string& name, int keep, int& fd);

}  // namespace drun::agent::detail

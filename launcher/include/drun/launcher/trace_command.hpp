// `drun trace DIR`: reads every rank's flight record under DIR (the job's log directory or one
// attempt's; flight_trace.hpp) and says which ranks never entered which collective and where
// the records disagree (op, dtype or size).
//
//   drun trace DIR
//
// Exit 0 when the records were read (whatever they say), 1 when a file is unreadable or
// malformed (the error names it) or there is none, 2 for a bad command line.
// Threading: runs on the caller's thread.
#pragma once

#include <string>
#include <vector>

namespace drun::launch {

// args: what follows "trace" on the command line. Prints the findings to stdout, errors to
// stderr; returns the exit code.
int runTrace(const std::vector<std::string>& args);

}  // namespace drun::launch

// `drun status`: what the jobs on a rendezvous store are doing (docs/observe.md), read
// from each job's history in the store (rdzv/<id>/events/, job_history.hpp).
//
//   drun status --rdzv-endpoint HOST[:PORT] [--rdzv-id ID] [--json] [--token-file PATH] [--timeout 5s]
//
// Every store call has the --timeout deadline; an endpoint that does not answer, refuses or is
// no drun store is an error naming it (exit 1); a bad command line exits 2.
// Threading: runs on the caller's thread.
#pragma once

#include <string>
#include <vector>

namespace drun::launch {

// args: what follows "status" on the command line. Returns the exit code; prints to stdout
// (the report) and stderr (errors).
int runStatus(const std::vector<std::string>& args);

}  // namespace drun::launch

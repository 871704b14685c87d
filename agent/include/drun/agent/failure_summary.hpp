// The failure summary drun prints when a job fails: the root cause (first worker to fail) with
// rank, node, exit code or signal name, time, and its error file (torch's @record JSON) or else
// the last lines of its stderr. Pure formatting plus one bounded file read.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "drun/agent/worker_group.hpp"
#include "drun/rendezvous/rendezvous.hpp"

namespace drun::agent {

// "SIGSEGV" for 11; "signal 77" when unknown.
std::string signalName(int signal);

// The message of a TORCHELASTIC_ERROR_FILE: torch writes {"message": {"message": "...",
// "extraInfo": {"py_callstack": "...", "timestamp": "..."}}} or {"message": "..."}. Returns
// nullopt when the file is absent; the raw text (bounded) when it is not JSON of that shape.
std::optional<std::string> readErrorFile(const std::filesystem::path& path);

// The root-cause record of a failure on this node: rank, node, code or signal, time, and the
// error file's message (else the last lines of stderr) as its detail. Every node of the job
// prints the summary of the same record.
rdzv::FailureRecord makeFailureRecord(const WorkerExit& rootCause, const std::string& node,
                                      const std::filesystem::path& errorFile, int otherFailures);

// Lines prefixed "drun: " (no trailing newline on the last).
std::string formatFailureSummary(const rdzv::FailureRecord& cause);

}  // namespace drun::agent

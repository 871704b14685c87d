// The failure summary drun prints when a job fails: the root cause (first worker to fail) with
// rank, node, exit code or signal name, time, and its error file (torch's @record JSON) or else
// the last lines of its stderr. Pure formatting plus one bounded file read.
#pragma once

#include <cstddef>
#include <deque>
#include <filesystem>
#include <string>
#include <string_view>

#include "drun/agent/worker_group.hpp"
#include "drun/rendezvous/rendezvous.hpp"

namespace drun::agent {

// "SIGSEGV" for 11; "signal 77" when unknown.
std::string signalName(int signal);

// What a worker's TORCHELASTIC_ERROR_FILE says. torch writes {"message": {"message": "...",
// "extraInfo": {"py_callstack": "...", "timestamp": "..."}}} or {"message": "..."}; a worker may
// write anything, so every other content is a Malformed file with the reason, never an exception.
struct ErrorFile {
  enum class State {
    Absent,      // no file: the worker did not write one
    Message,     // `text` is its message (plus the Python call stack when there is one)
    Unreadable,  // `text` says why it could not be read (permissions, a directory, too large)
    Malformed,   // `text` says what is wrong with its content (not JSON, wrong types, binary)
  };
  State state = State::Absent;
  std::string text;
};

// Reads and parses an error file (at most kMaxErrorFileBytes). Never throws.
ErrorFile readErrorFile(const std::filesystem::path& path) noexcept;
inline constexpr size_t kMaxErrorFileBytes = 1 << 20;

// The evidence a summary shows for a failed worker: `source` is "error file <path>" (its message
// in `detail`), "stderr" (the tail's lines in `detail`), "" (neither), or, when the error file is
// unreadable or malformed, "error file <path> is malformed: <what is wrong>; last lines of stderr"
// with the tail (or "(no stderr output)") in `detail`. With `showPath` false (the file is removed
// when drun exits: no --log-dir), the path is left out: a summary never names a file that is gone.
// Never throws but std::bad_alloc.
struct FailureEvidence {
  std::string source;
  std::string detail;  // lines
};
FailureEvidence failureEvidence(const std::filesystem::path& errorFile,
                                const std::deque<std::string>& stderrTail, bool showPath = true);

// The root-cause record of a failure on this node: rank, node, code or signal, time, and the
// error file's message (else the last lines of stderr) as its detail. Every node of the job
// prints the summary of the same record.
rdzv::FailureRecord makeFailureRecord(const WorkerExit& rootCause, const std::string& node,
                                      const std::filesystem::path& errorFile, int otherFailures,
                                      bool showPath = true);

// A hang (docs/hangs.md): the record says so in its detailSource, "hang (stack: <how>): <what>"
// (what: the detector's verdict, e.g. no heartbeat for 5.2s (hang timeout 5s)); `stack` replaces
// the detail when given (a native worker's eu-stack excerpt), else the detail stays the stderr
// tail (a Python worker's faulthandler traceback). The summary then reads "hung: <what>".
// `why` (why this rank and not the others) becomes the detail's first line, "why: ...", which
// the summary shows before the stack; with a faulthandler traceback it gains the Python line
// the rank was at ("at hang.py:12 in <module>").
void markHang(rdzv::FailureRecord& record, const std::string& what, const std::string& stackHow,
              const std::string& stack, const std::string& why = {});
bool isHang(const rdzv::FailureRecord& record);
// The deepest nesting of [ and { outside strings: checked before parsing an untrusted JSON file
// (the parser and json's destructor recurse).
size_t jsonNestingDepth(std::string_view text);
// A hang that a timeout learned by --hang-timeout auto called.
bool isLearnedHang(const rdzv::FailureRecord& record);
// "hung: no heartbeat for ..." for a hang, else "exit code 3" / "signal SIGKILL".
std::string describeStatus(const rdzv::FailureRecord& record);

// Lines prefixed "drun: " (no trailing newline on the last).
std::string formatFailureSummary(const rdzv::FailureRecord& cause);

}  // namespace drun::agent

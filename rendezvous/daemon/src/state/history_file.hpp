// The daemon's kept history (drun-rendezvous --state-dir; docs/observe.md, "History in the
// store"): which keys are kept, their text form, and reading that text back.
//
// Kept, per job: its events (rdzv/<id>/events/next and rdzv/<id>/events/<slot>) and, for an ENDED
// job only (one with rdzv/<id>/outcome), its tombstone `outcome` and `round`. A running job's
// `round` is never kept: its agents refill a restarted store only when the store lacks the job
// (docs/rendezvous.md, "The store restarted"), and a restored round would make their refill a
// newcomer's re-form.
//
// The text: {"version": 1, "jobs": {"<id>": {"events/next": "12", "events/3": "{...}",
// "outcome": "...", "round": "4"}}}. What is read back is untrusted: parseHistory refuses a text
// that this file would not have written, saying what is wrong.
// Threading: free functions; snapshotHistory reads the core, so it runs on the core's thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "drun/store/store_core.hpp"

namespace drun::rdzv::state {

inline constexpr int kHistoryFileVersion = 1;

// Whether a write to `key` may change what snapshotHistory writes.
bool isHistoryKey(std::string_view key);

struct HistorySnapshot {
  std::string text;
  std::vector<std::string> leftOut;  // jobs whose history would have passed maxBytes
};
// The kept keys of every job in `core`, as text of at most maxBytes: a job whose entry would pass
// it is left out (and named in leftOut). Values that are not UTF-8 text are left out.
HistorySnapshot snapshotHistory(const StoreCore& core, size_t maxBytes);

struct JobHistoryKeys {
  std::string runId;
  std::vector<std::pair<std::string, Bytes>> entries;  // full keys (rdzv/<id>/...) and values
};
// The jobs of a text snapshotHistory wrote. Throws InvalidArgument saying what is wrong (not
// JSON, another version, a bad run id, a key that is not kept, a value of the wrong form, a
// `round` without an `outcome`).
std::vector<JobHistoryKeys> parseHistory(std::string_view text);

}  // namespace drun::rdzv::state

// drun's worker API (C++): heartbeats and named sections for drun's hang detection
// (docs/hangs.md); a thin wrapper over drun/worker.h. No-ops outside drun.
//
//   drun::worker::Section step("step");   // until the end of the scope
//   drun::worker::heartbeat();
//
// Threading and ownership: as drun/worker.h (sections: one stack per process).
#pragma once

#include "drun/worker.h"

namespace drun::worker {

inline bool enabled() { return drun_worker_enabled() != 0; }
inline void heartbeat() { drun_worker_heartbeat(); }

// RAII section: entered on construction, left on destruction.
class Section {
 public:
  explicit Section(const char* name) { drun_worker_section_begin(name); }
  ~Section() { drun_worker_section_end(); }
  Section(const Section&) = delete;
  Section& operator=(const Section&) = delete;
};

}  // namespace drun::worker

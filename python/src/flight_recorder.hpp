// FlightRecorder: this rank's last collectives on drun's backend, in a ring (sequence number per
// group, op, dtype, element count, group, state, queued/start/end times), written as one JSON
// file (flight_record_rank<R>.json, the format of agent/include/drun/agent/flight_trace.hpp) into
// the attempt directory when a collective fails or times out, or when the process gets SIGUSR2
// (drun's agent sends it to every rank on a hang; anyone may send it). An empty record is written
// when the recorder starts: the agent signals only ranks that have one (SIGUSR2's default
// action would kill a process without the handler). `drun trace DIR` reads the files.
//
// DRUN_FLIGHT_RECORDER_ENTRIES: the ring's size (default 256; 0: off). The record's directory:
// DRUN_FLIGHT_RECORD_DIR, else the attempt directory (two levels above DRUN_WORKER_CHANNEL);
// neither: nothing is written. SIGUSR2 is taken only while its disposition is the default.
//
// Threading: any thread may record (one mutex, no allocation after the first collective of a
// group); the signal handler and a failed collective only write a byte to a pipe, and the
// recorder's own thread (owned, joined at exit, after the writes asked for) writes the file, so
// the group's queue goes on while it is written.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace drun::torch_backend {

class FlightRecorder {
 public:
  // The process's recorder (made on first use, with its thread and the SIGUSR2 handler).
  static FlightRecorder& instance();

  // A collective was issued on the group `group` (any stable identity: the process group)
  // whose world ranks are `worldRanks`; returns its ticket (0 when the recorder is off).
  uint64_t issued(const void* group, const std::vector<int>& worldRanks, const char* op,
                  const std::vector<at::Tensor>& tensors);
  void started(uint64_t ticket);
  // Ended; a failure (a timeout, a dead peer) writes the record.
  void ended(uint64_t ticket, bool ok);
  // Writes the record now; never throws (a write that fails is skipped).
  void write(const char* reason) noexcept;

  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

 private:
  FlightRecorder();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace drun::torch_backend

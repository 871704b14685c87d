// LogRotation: how the workers' log files under --log-dir (per-rank stdout.log/stderr.log, the
// filtered_*.log files) are kept bounded. A file that reaches maxBytes is renamed FILE.1 (FILE.1
// to FILE.2, ..., the oldest past FILE.<maxFiles> removed) and FILE starts empty; the bytes are
// cut at exactly maxBytes, so FILE.<maxFiles> ... FILE.1 FILE read in that order are the stream's
// last bytes, none lost among them. Plain data; thread-safe to copy.
#pragma once

#include <cstdint>

namespace drun::agent {

struct LogRotation {
  // 0: one file that grows without bound (torchrun's behaviour, which jobs that read the whole
  // file afterwards rely on).
  uint64_t maxBytes = 0;
  // Rotated files kept beside FILE; 0 keeps none (FILE is emptied when full).
  int maxFiles = 5;
};

}  // namespace drun::agent

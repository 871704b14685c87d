// Flight records: each rank of drun's torch backend keeps its last collectives in a ring and
// writes them, on a hang (the agent's SIGUSR2), a collective timeout or SIGUSR2, as one small
// JSON file per rank (flight_record_rank<R>.json in the attempt directory; the format below).
// This unit reads a directory of them and says which ranks never entered which collective and
// where the records disagree (op, dtype or size): `drun trace DIR` prints it, the hang summary
// quotes it.
//
//   {"version": 1, "rank": 1, "world_size": 2, "pid": 77, "reason": "SIGUSR2",
//    "entries": [{"group": "0", "seq": 6, "op": "all_reduce", "dtype": "Float", "count": 4,
//                 "state": "started", "queued_ns": 1, "start_ns": 2, "end_ns": 0}, ...]}
//
// Untrusted input (a worker wrote it, or a crash truncated it): every file is bounded (1 MiB,
// 4096 entries, 64-deep JSON), and one that is not a record is an error naming the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace drun::agent {

struct FlightEntry {
  std::string group;
  uint64_t seq = 0;
  std::string op, dtype, state;  // state: queued, started, completed, failed
  int64_t count = 0;
  int64_t queuedNs = 0, startNs = 0, endNs = 0;
};

struct FlightRecord {
  std::filesystem::path file;
  int rank = -1;
  int worldSize = 0;
  int64_t pid = 0;
  std::string reason;
  std::vector<FlightEntry> entries;
};

inline constexpr const char* kFlightRecordPrefix = "flight_record_rank";  // + <rank>.json
inline constexpr size_t kMaxFlightRecordBytes = 1 << 20;
inline constexpr size_t kMaxFlightEntries = 4096;

// One file; throws drun::Error naming the file and what is wrong with it.
FlightRecord readFlightRecord(const std::filesystem::path& file);
// Every flight_record_rank*.json under `dir` (at most 3 levels down, 4096 files); throws
// drun::Error for an unreadable directory or file, or a malformed record.
std::vector<FlightRecord> readFlightRecords(const std::filesystem::path& dir);

struct FlightFindings {
  std::vector<std::string> neverEntered;  // "rank 1 never entered all_reduce #6 of group 0 (its last: ...)"
  std::vector<std::string> disagree;      // "group 0 #6: rank 0 all_reduce Float x4, rank 1 all_reduce Float x3"
  std::vector<std::string> missing;       // "no record from rank 2"
  bool empty() const { return neverEntered.empty() && disagree.empty() && missing.empty(); }
};
FlightFindings analyzeFlightRecords(const std::vector<FlightRecord>& records);
// The findings as lines (no trailing newline), or "the records agree: ..." when there are none.
std::string describeFlightFindings(const std::vector<FlightRecord>& records, const FlightFindings& findings);

}  // namespace drun::agent

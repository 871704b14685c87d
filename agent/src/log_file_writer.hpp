// LogFileWriter: the workers' per-rank log files (--log-dir, -r/-t) written off the event loop.
// A stalled network file system under --log-dir blocks a write(2) for as long as it
// stalls; on the loop that stopped signal handling. One thread per process writes every file,
// FIFO; the loop only queues. A bounded queue gives back-pressure: once it holds kHighWater bytes
// the mux stops reading the pipes that feed files (their workers block on their own writes, as
// with a slow console) until the thread is down to kLowWater. A write error closes that file and
// is reported once (takeFailures(), on the loop: the thread does not log). A file opened with a
// LogRotation rotates on the thread too (log_file_rotation.cpp), between two writes.
//
// Threading: every public call from any thread; `whenWritable` callbacks run on the writer's
// thread with its lock held: they must only post. Ownership: a process-wide instance
// (standard()) that owns its thread (an OwnedThread: signals blocked); a File's fd is closed once
// the last of its queued bytes are written and nobody holds the File.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "drun/agent/log_rotation.hpp"
#include "drun/common/owned_thread.hpp"

namespace drun::agent::detail {

class LogFileWriter {
 public:
  static constexpr size_t kHighWater = 8 << 20;
  static constexpr size_t kLowWater = 2 << 20;

  struct File;  // an open log file (fd, name, rotation, bytes in it, failed)

  static std::shared_ptr<LogFileWriter> standard();
  LogFileWriter();
  static constexpr std::chrono::milliseconds kStopBound{1000};
  // Stops the thread once the queue is empty and joins it within kStopBound; a write blocked
  // past it (a stalled disk) is left to end on its own.
  ~LogFileWriter();
  LogFileWriter(const LogFileWriter&) = delete;
  LogFileWriter& operator=(const LogFileWriter&) = delete;

  // Creates (truncates) `path` for appending, rotated as `rotation` says (its rotated copies of
  // an earlier run stay until the first rotation replaces them); throws drun::Error naming it when
  // it cannot.
  std::shared_ptr<File> open(const std::filesystem::path& path, const LogRotation& rotation = {});
  // Queues `bytes` for `file` (nothing once a write to it failed).
  void write(const std::shared_ptr<File>& file, std::string_view bytes);

  bool congested() const;
  // When congested: keeps `resume` to run once the queue is down to kLowWater; returns false
  // (and keeps nothing) when not congested. cancel(owner) drops owner's callbacks.
  bool whenWritable(const void* owner, std::function<void()> resume);
  void cancel(const void* owner);

  // "<file>: <error>" for each file whose write failed since the last call.
  std::vector<std::string> takeFailures();

  // Waits up to `timeout` for the queue to be written; false when it was not.
  bool drain(std::chrono::milliseconds timeout);

 private:
  struct State;
  std::shared_ptr<State> state_;
  OwnedThread thread_;
};

}  // namespace drun::agent::detail

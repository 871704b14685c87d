// StateKeeper: drun-rendezvous --state-dir, whole. The daemon keeps its jobs' history across
// restarts (docs/observe.md, "History in the store"):
//
//   - at start (in StoreServer::attach, before the server serves) DIR/state.json is read back and
//     restored into the store; a file that cannot be used (unreadable, over the cap, truncated,
//     not what this daemon writes) gets a warning naming it and what is wrong, is moved aside
//     (state.json.bad-<time>), and the daemon starts empty;
//   - a write observer marks the history stale when a kept key changes (history_file.hpp) and
//     arms a timer on the io thread: flushPeriod later, the history is serialized (bounded by
//     maxBytes: jobs past it are left out, with a warning) and handed to the writer thread, which
//     writes it off the loop (state_file.hpp). Only the newest text waits: an older one not yet
//     written is replaced. The timer is armed only while a change waits.
//
// Threading: constructed before the server starts; its timer and observer run on the io thread.
// stop() from any thread before the server stops (it posts to the io; the timer no longer
// holds the io). finish() after the server stopped (its io thread joined): writes what changed
// since the last write, from the calling thread, then joins the writer. Ownership: owns the
// writer thread (joined by finish() or the destructor); destroy it after the server stopped (or
// before it started); the StoreServer must outlive it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "drun/store/store_server.hpp"

namespace boost::asio {
class io_context;
}

namespace drun::rdzv::state {

struct StateKeeperOptions {
  std::filesystem::path dir;                            // holds state.json
  size_t maxBytes = size_t{16} << 20;                   // the file's cap, read and written
  std::chrono::milliseconds flushPeriod = std::chrono::seconds(1);  // how often a change is written
};

class StateKeeper {
 public:
  // Creates options.dir if needed (InvalidArgument naming --state-dir when it cannot be, or is not
  // writable), restores state.json into the server's store, and starts the writer.
  StateKeeper(StoreServer& server, StateKeeperOptions options);
  ~StateKeeper();
  StateKeeper(const StateKeeper&) = delete;
  StateKeeper& operator=(const StateKeeper&) = delete;

  const std::filesystem::path& file() const { return file_; }
  size_t jobsRestored() const { return jobsRestored_; }
  void stop();    // before the server stops
  void finish();  // after the server stopped; idempotent

 private:
  class Timer;
  void restore(StoreCore& core);
  void flush();  // the core's thread: serialize if stale, hand to the writer
  void writerLoop();

  StateKeeperOptions options_;
  std::filesystem::path file_;
  boost::asio::io_context* io_ = nullptr;
  StoreCore* core_ = nullptr;
  std::unique_ptr<Timer> timer_;
  size_t jobsRestored_ = 0;
  bool stale_ = false;                 // the core's thread only
  std::vector<std::string> leftOut_;   // the core's thread only: warned about once

  std::mutex mutex_;
  std::condition_variable wake_;
  std::optional<std::string> pending_;  // under mutex_
  bool stopping_ = false;               // under mutex_
  std::thread writer_;
};

}  // namespace drun::rdzv::state

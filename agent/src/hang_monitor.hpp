// HangMonitor: this node's side of hang detection for one attempt after another. It creates a
// worker channel per local rank (drun/worker_channel.h) in the attempt directory, reads them on a
// timer while the workers run, and when the HangDetector calls a rank hung it takes the rank's
// stack and ends it: a Python worker gets SIGABRT (faulthandler, which drun enables, writes every
// thread's traceback to its stderr; SIGKILL after the stack deadline), a native one is read with
// eu-stack / gdb / /proc (stack_capture.hpp) and then SIGKILLed. Its exit then takes the agent's
// usual failure path; report() gives the hang's story for the root-cause record.
//
// Threading: everything on the io_context passed in. Ownership: owns the channel fds and the
// captures in flight; the agent owns the monitor and the LearnedTimeouts it is given.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "drun/agent/hang_options.hpp"
#include "hang_detector.hpp"
#include "idle_probe.hpp"
#include "stack_capture.hpp"
#include "timer_fifo.hpp"

namespace drun::agent::detail {

struct HangReport {
  int localRank = 0;
  HangVerdict verdict;
  std::chrono::system_clock::time_point detected;
  std::string stackHow;   // "eu-stack", "gdb", "/proc wchan", "faulthandler (stderr)"
  std::string stackText;  // native: the excerpt; Python: empty (its stderr tail has it)
};

class HangMonitor {
 public:
  // `onHang` is told (before the stack is taken) so the agent can say so.
  using HangHandler = std::function<void(const HangReport&)>;
  HangMonitor(boost::asio::io_context& io, const HangOptions& options, LearnedTimeouts& learned);
  ~HangMonitor();

  // A new attempt: forgets the last one's reports and timers, creates `ranks` channels under
  // attemptDir (<local_rank>/channel) and returns their paths. The first call also creates the
  // torch FileTimer FIFO beside the attempt directories (timerFile()).
  std::vector<std::filesystem::path> prepare(const std::filesystem::path& attemptDir, int ranks);
  // The workers run (pids by local rank): reads the channels until stop().
  void start(const std::vector<pid_t>& pids, bool python, HangHandler onHang);
  void exited(int localRank, bool succeeded);  // that rank is not checked any more
  // An in-process recovery replaces the rank: before the new process starts, its channel is made
  // afresh (at the path prepare() returned) and its earlier hang report forgotten; once it
  // started (`pid`), it is checked again.
  void replacing(int localRank);
  void replaced(int localRank, pid_t pid);
  void stop();                 // no more checks or captures (reports are kept)
  const HangReport* report(int localRank) const;
  std::filesystem::path timerFile() const;  // empty when it could not be created

 private:
  void poll();
  void act(int localRank, HangVerdict verdict, int signal);
  void checkTimers();
  void checkIdle(int64_t nowNs);

  boost::asio::io_context& io_;
  const HangOptions& options_;
  LearnedTimeouts& learned_;
  boost::asio::steady_timer timer_;
  std::vector<int> fds_;
  std::vector<std::filesystem::path> paths_;  // each rank's channel (empty: none)
  std::vector<pid_t> pids_;
  std::vector<bool> live_;
  bool someoneFinished_ = false;  // a local rank exited 0 (--hang-idle)
  std::optional<IdleProbe> idleProbe_;
  int64_t nextIdleSampleNs_ = 0;
  std::optional<HangDetector> detector_;
  bool python_ = false;
  bool running_ = false;
  HangHandler onHang_;
  std::map<int, HangReport> reports_;
  std::vector<std::shared_ptr<StackCapture>> captures_;
  std::vector<std::unique_ptr<boost::asio::steady_timer>> killTimers_;
  std::unique_ptr<TimerFifo> timerFifo_;
};

}  // namespace drun::agent::detail

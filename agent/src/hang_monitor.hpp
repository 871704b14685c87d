// HangMonitor: this node's side of hang detection for one attempt after another. It creates a
// worker channel per local rank (drun/worker_channel.h) in the attempt directory, reads them on a
// timer while the workers run. When the HangDetector (or --hang-idle) finds ranks past their
// timeout, it takes every live rank's stack and blames the one not waiting for its peers
// (hang_blame.hpp); when all of them wait, they get a waiter's grace first. The culprit is ended:
// a Python worker gets SIGABRT (faulthandler, which drun enables, writes every thread's traceback
// to its stderr; SIGKILL after the stack deadline), a native one, whose stack the survey already
// took (eu-stack / gdb / /proc, stack_capture.hpp), is SIGKILLed. Its exit then takes the agent's
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
#include <set>
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
  std::string blame;      // why this rank and not the others (hang_blame.hpp), or ""
};

// A timeout --hang-timeout auto now uses: for `key` ("" = heartbeats, else a section), `timeout`
// (factor x `longest`, or the floor).
struct LearnedNote {
  std::string key;
  std::chrono::milliseconds timeout{0};
  std::chrono::milliseconds longest{0};
  bool floor = false;  // the floor, above factor x longest
};

class HangMonitor {
 public:
  // `onHang` is told (before the stack is taken) so the agent can say so.
  using HangHandler = std::function<void(const HangReport&)>;
  // Told when a learned timeout is first used, and when it grows by half or more (once per
  // key and generation of LearnedTimeouts, not every poll).
  using LearnedHandler = std::function<void(const LearnedNote&)>;
  void onLearned(LearnedHandler handler) { onLearned_ = std::move(handler); }
  HangMonitor(boost::asio::io_context& io, const HangOptions& options, LearnedTimeouts& learned);
  ~HangMonitor();

  // A new attempt: forgets the last one's reports and timers, creates `ranks` channels under
  // attemptDir (<local_rank>/channel) and returns their paths. The first call also creates the
  // torch FileTimer FIFO beside the attempt directories (timerFile()).
  std::vector<std::filesystem::path> prepare(const std::filesystem::path& attemptDir, int ranks);
  // The workers run (pids by local rank; global rank = rankOffset + local rank): reads the
  // channels until stop().
  void start(const std::vector<pid_t>& pids, bool python, HangHandler onHang, int rankOffset = 0);
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
  // `taken`: the rank's stack, already taken by the survey (a native worker is not read again).
  void act(int localRank, HangVerdict verdict, int signal, const StackExcerpt* taken = nullptr,
           std::string blame = {});
  void checkTimers();
  void checkIdle(int64_t nowNs);
  void announceLearned();
  // Ranks past their timeout: every live rank's stack is taken, then blame() picks the culprit.
  using Candidates = std::vector<std::pair<int, HangVerdict>>;
  void startSurvey(Candidates candidates, bool mayBlameWaiter);
  void blame();
  // Ranks whose flight recorder runs (a record with their pid) are asked for it (SIGUSR2); what
  // the records say once the survey is done ("" when none, or they agree).
  void askFlightRecords();
  std::string flightFindings() const;

  struct Survey {
    Candidates candidates;
    bool mayBlameWaiter = false;
    std::map<int, StackExcerpt> stacks;
    size_t pending = 0;
    // The flight records asked for (SIGUSR2) and when: blame() waits (up to a second) until each
    // was rewritten since.
    std::vector<std::filesystem::path> flightFiles;
    std::filesystem::file_time_type flightAsked;
    std::chrono::steady_clock::time_point askedAt;
  };
  bool flightRecordsWritten() const;

  boost::asio::io_context& io_;
  const HangOptions& options_;
  LearnedTimeouts& learned_;
  boost::asio::steady_timer timer_;
  std::vector<int> fds_;
  std::vector<std::filesystem::path> paths_;  // each rank's channel (empty: none)
  std::filesystem::path flightDir_;           // where drun's backend writes its flight records
  std::vector<pid_t> pids_;
  std::vector<bool> live_;
  bool someoneFinished_ = false;  // a local rank exited 0 (--hang-idle)
  std::optional<IdleProbe> idleProbe_;
  int64_t nextIdleSampleNs_ = 0;
  std::optional<HangDetector> detector_;
  bool python_ = false;
  bool running_ = false;
  int rankOffset_ = 0;
  std::optional<Survey> survey_;
  std::set<int> foundWaiting_;  // candidates a survey found waiting: they got the waiter's grace
  HangHandler onHang_;
  LearnedHandler onLearned_;
  std::map<std::string, std::chrono::milliseconds> announced_;  // of learned_.generation below
  uint64_t announcedGeneration_ = 0;
  std::map<int, HangReport> reports_;
  std::vector<std::shared_ptr<StackCapture>> captures_;
  std::vector<std::unique_ptr<boost::asio::steady_timer>> killTimers_;
  boost::asio::steady_timer flightTimer_;  // blame() waiting for the flight records
  std::unique_ptr<TimerFifo> timerFifo_;
};

}  // namespace drun::agent::detail

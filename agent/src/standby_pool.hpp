// StandbyPool: the standby workers of one node for one round (docs/recovery.md, "Standby
// workers"): processes of the program started ahead of need under --recovery in-process, which
// wait inside `import drun` (python/drun/_standby.py) until the agent assigns one a failed rank.
//
// Each standby has a slot (numbered from 0 in the round) and a FIFO of its own,
// <dir>/standby_<slot>, named in its DRUN_STANDBY. A standby is ready once it holds its FIFO
// open for reading (it waits in `import drun`): only then does the FIFO open for writing
// without blocking, which is how the pool tells a ready standby from one still importing or
// one running a program that never imports drun (neither is taken). The assignment is one line
// of JSON, {"env": {NAME: VALUE...}, "unset": [NAME...]}: what the replacement's environment
// has that the standby's lacks or has otherwise, and what it lacks; written whole (far below
// the pipe's capacity), after which the pool closes its end.
//
// Threading: the agent's loop thread. Ownership: owns the FIFOs (closed and removed by the
// destructor); the processes are the WorkerGroup's, which must outlive the pool.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "drun/agent/worker_group.hpp"

namespace drun::agent::detail {

// The assignment line (above) that turns a process started with `standby`'s environment into
// one with `replacement`'s; ends in '\n'.
std::string standbyAssignment(const WorkerSpec& standby, const WorkerSpec& replacement);

class StandbyPool {
 public:
  struct Options {
    int count = 1;               // standbys kept alive
    std::filesystem::path dir;   // where the FIFOs go (the attempt's directory)
  };

  StandbyPool(WorkerGroup& group, Options options, WorkerSpec spec);
  ~StandbyPool();
  StandbyPool(const StandbyPool&) = delete;
  StandbyPool& operator=(const StandbyPool&) = delete;

  struct Started {
    int slot = 0;
    pid_t pid = 0;
  };
  // Starts standbys until `count` are alive; returns those it started. One that cannot start
  // (no FIFO, the group stopping): logged at debug, and the pool stops.
  std::vector<Started> fill();
  // Which standbys assign() may take.
  enum class Taking {
    Ready,     // only one waiting in `import drun` (its FIFO open for reading)
    Starting,  // else one still starting (importing): its assignment waits in its FIFO, which
               // the pool holds open (read and write) until the pool ends. For a spare taking a
               // place: a standby with a head start beats a new process.
  };
  // The oldest ready standby (with Taking::Starting, else the oldest live one) becomes the worker
  // of `replacement`'s ranks (WorkerGroup::assign) and is sent its assignment. nullopt when none
  // can be taken or the pool stopped. Throws drun::Error when the assignment cannot be written
  // (the process is then SIGKILLed).
  std::optional<pid_t> assign(const WorkerSpec& replacement, Taking taking = Taking::Ready);
  // The standby in `slot` ended unassigned (WorkerGroup::onStandbyExit).
  void exited(int slot);
  // From now on fill() keeps `count` alive (a spare's pool, one per local rank while it waits,
  // keeps the round's count once it took a place); live ones beyond it are kept.
  void keep(int count) { options_.count = count; }
  // No standby any more: the live ones are SIGKILLed, fill() does nothing.
  void stop();
  bool stopped() const { return stopped_; }

 private:
  struct Slot {
    std::filesystem::path path;
    pid_t pid = 0;
    bool live = false;  // started, neither assigned nor ended
    int held = -1;      // assigned while starting: the FIFO, held open until the pool ends
  };
  // Gives the standby in `slot` its assignment through `fd` (open for writing); closes `fd`
  // unless `hold`. nullopt when it ended meanwhile.
  std::optional<pid_t> send(int slot, Slot& s, int fd, bool hold, const WorkerSpec& replacement);

  WorkerGroup& group_;
  Options options_;
  WorkerSpec spec_;
  std::map<int, Slot> slots_;
  int nextSlot_ = 0;
  bool stopped_ = false;
};

}  // namespace drun::agent::detail

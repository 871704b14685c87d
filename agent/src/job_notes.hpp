// JobNotes: what the agent writes into the job's event log (docs/observe.md; the
// fields: event_fields.hpp). The agent's state machine says when something happened; this unit
// turns it into events and remembers what the events need across rounds (the last round's
// hosts, a lost member: the next round's rank 0 names the replacement).
//
// Threading: the agent's loop thread (the sinks write on their own threads).
// Ownership: owns the event log. The store sink reaches the rendezvous only while attached:
// detachStore() cuts it off before the rendezvous goes (a sink's store call may outlive run()).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <sys/types.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "drun/agent/agent_config.hpp"
#include "drun/agent/console_writer.hpp"
#include "drun/agent/worker_group.hpp"
#include "drun/rendezvous/rendezvous.hpp"
#include "event_log.hpp"
#include "hang_monitor.hpp"

namespace drun::agent::detail {

class JobNotes {
 public:
  static constexpr std::chrono::milliseconds kFlushDeadline{2000};

  // The sinks `config` asks for: --events' file, the job's history in `rendezvous`' store.
  JobNotes(const AgentConfig& config, rdzv::Rendezvous& rendezvous,
           std::shared_ptr<ConsoleWriter> console);
  ~JobNotes();
  JobNotes(const JobNotes&) = delete;
  JobNotes& operator=(const JobNotes&) = delete;

  void note(std::string_view kind, nlohmann::json fields = nlohmann::json::object());
  // round_formed, worker_started (one per pid, by local rank), spare_taken_in, replacement.
  // `fromStandby` (a spare that took a place): each worker's event says its generation and
  // whether a standby took its ranks.
  void roundStarted(const rdzv::RoundResult& round, const std::vector<pid_t>& pids, int attempt,
                    const std::vector<bool>& fromStandby = {});
  // A round that carries the running one on with the same workers (a refilled store): its
  // round_formed and round_continued, no worker_started (the workers did not start again).
  void roundContinued(const rdzv::RoundResult& round, uint64_t fromRound);
  // worker_exited, and hang_detected for a failed worker that hung.
  void workerExited(const WorkerExit& exit, uint64_t round, const HangReport* hang);
  // failure_recorded and restart (unless final): the round's root cause this node acted on,
  // written by every node, once each: from its own report's verdict, or from the job's failure
  // it learned of (jobEvent), whichever comes first.
  void rootCause(const rdzv::FailureRecord& cause, const rdzv::RoundResult& round);
  // node_lost, node_waiting, store_lost; failure_recorded and restart for a failure (rootCause).
  void jobEvent(const rdzv::JobEvent& e);

  void flush() { log_.flush(kFlushDeadline); }
  // From now on the store sink finds no rendezvous (it writes nothing more).
  void detachStore();

 private:
  struct StoreSource;
  int nprocPerNode_;
  int maxRestarts_;
  EventLog log_;
  std::shared_ptr<StoreSource> store_;
  std::vector<std::string> previousHosts_;  // of the last round this node ran
  bool memberLostSinceRound_ = false;       // a member was lost since this node's last round
  int restartCount_ = 0;                    // of the last round this node ran
  // The last root cause written: (round, rank, pid, time), each written once.
  std::optional<std::tuple<uint64_t, int, int64_t, int64_t>> lastCause_;
};

}  // namespace drun::agent::detail

// The elastic agent's inputs: the events its state machine reacts to, what each carries, and
// the shape of its rule table ((state, event) -> (next state, action)) with the check that no
// (state, event) has two rules. The table itself is the agent's (elastic_agent.cpp).
//
// Threading: plain values, used on the agent's loop thread.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "drun/agent/elastic_agent.hpp"
#include "drun/agent/worker_group.hpp"
#include "drun/rendezvous/rendezvous.hpp"

namespace drun::agent::detail {

enum class Event {
  Start,
  RoundFormed,       // the rendezvous returned this node's place in a round
  RendezvousFailed,  // joining failed (timeout, too few nodes, the store is gone)
  JobEnded,          // the job failed while this node waited to join (a spare)
  JobEndedOk,        // the job succeeded while this node waited to join
  WorkerFailed,      // a local worker exited non-zero or by a signal
  WorkersSucceeded,  // every local worker exited 0
  WorkersStopped,    // the group finished stopping
  VerdictRestart,    // our failure report: the job restarts
  VerdictFinal,      // our failure report: the budget is spent
  JobFailed,         // a failure anywhere (the watcher), restartable
  JobFailedFinal,    // a failure anywhere, budget spent
  JobSucceeded,      // every node's workers succeeded
  MemberLost,
  NodeWaiting,
  ScaleUpDue,        // the last call after a node began waiting
  ScaleUpClaimed,    // this round re-forms to take the waiting nodes in (this node's claim or
                     // another member's, found by finish())
  ScaleUpRefused,    // a member finished the round first: the job runs to its end
  StoreLost,
  // A store lost while the workers run (agent_store_loss.cpp)
  StoreLostKeepingWorkers,  // the store was lost under --recovery restart: reconnect, workers running
  StoreRefilled,            // it had restarted empty (lost by every member): rejoin, workers running
  StoreKeptJob,             // it still held the job (lost by this node only): stop the workers
  FenceDue,                 // it stayed away past heartbeat_timeout: stop the workers
  RoundContinues,           // the round formed after it carries the workers' round on unchanged
  RoundChanged,             // it has other members (or a failure in its count): restart the workers
  // --recovery in-process (agent_recovery.cpp)
  WorkerToReplace,       // a local worker failed while the node runs: replace it in place
  RecoveryOpened,        // this node opened a generation for it (budget spent, generation moved)
  RecoveryRefused,       // no recovery: the budget is spent, or the store refused
  GenerationBegan,       // a generation began (opened here or on another node)
  RecoveryFormed,        // the newest generation's outcome: formed
  RecoveryDue,           // recovery_timeout passed for the generation this node opened
  ReplacementFailed,     // the replacement this node started ended before its generation formed
  RecoveryFellBack,      // the generation this node opened fell back: stop, report, restart
  PeerRecoveryFellBack,  // a generation another node opened fell back: stop and re-form
  // A lost node replaced in place (agent_node_recovery.cpp)
  NodeLost,              // a member node was lost while this node runs: its place goes to a spare
  NodeRecoveryOpened,    // this node claimed the lost node's place, opened its generation, offered it
  LossUnrecovered,       // no recovery of the loss began within recovery_timeout: stop and re-form
  // A grow in place (agent_grow.cpp)
  GrowWanted,            // a node waits to join and the job is below MAX: offer it a place at the end
  GrowthOpened,          // this node claimed the grow, opened its generation and offered the place
  Signal,            // drun itself received a signal that ends the job
  WorkersSignalled,  // every local worker ended by one SIGTERM/SIGINT from outside drun (scancel)
  InternalError,     // an exception escaped an action
};
const char* toString(Event e);

// What an event carries.
struct Input {
  std::string reason;
  std::optional<WorkerExit> exit;
  std::optional<rdzv::RoundResult> round;
  std::optional<rdzv::FailureRecord> failure;
  int signal = 0;
  int code = 0;
  uint64_t generation = 0;  // the recovery's generation (NodeLost: the loss's, when it came first)
  int restartCount = 0;     // the job's restart count including it
  std::vector<rdzv::Vacancy> places;  // NodeRecoveryOpened, GrowthOpened: the places offered
};

// One rule of the machine: in `from`, `event` moves to `to` and runs `action` (may be null).
template <typename Action>
struct Rule {
  AgentState from;
  Event event;
  AgentState to;
  Action action;
};

// True when two rules share their (state, event): the machine would silently take the first.
template <typename Action, size_t N>
constexpr bool hasDuplicateRule(const Rule<Action> (&rules)[N]) {
  for (size_t i = 0; i < N; ++i)
    for (size_t j = i + 1; j < N; ++j)
      if (rules[i].from == rules[j].from && rules[i].event == rules[j].event) return true;
  return false;
}

}  // namespace drun::agent::detail

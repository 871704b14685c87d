// ElasticAgent: the node agent's state machine. Joins a rendezvous round, starts the local
// WorkerGroup with the torchrun environment, and reacts on one event loop to worker exits, the
// job's events (a failure anywhere, a lost or waiting node, the job's success, a lost store) and
// signals: it re-forms the job, exits with the root cause, or waits in the exit barrier.
// The transitions are one table (state x event -> next state, action): agent/README.md.
//
// Threading: run() blocks the calling thread and drives everything on its own io_context; the
// rendezvous' blocking calls run on one helper thread (OffLoop), never on the loop.
// Ownership: owns the rendezvous, the worker group and the job guard.
#pragma once

#include <memory>
#include <string>

#include "drun/agent/agent_config.hpp"

namespace drun::agent {

enum class AgentState {
  Init,
  Rendezvous,          // joining a round (off the loop)
  Running,             // this node's workers run
  Recovering,          // --recovery in-process: a generation is open, the workers run
  StoppingForFailure,  // a local worker failed: stopping the others, then report it
  Reporting,           // telling the job about the failure: the store says restart or end
  StoppingForReform,   // the job re-forms (a failure elsewhere, a lost or new node, fencing)
  StoppingToExit,      // the job ends (budget spent, a signal): stopping, then exit
  Finishing,           // this node's workers succeeded: waiting for the rest (exit barrier)
  Reconnecting,        // the store was lost: rejoining it (a refill) while the workers run
  StoppingForRound,    // the store came back with other members: stopping, then the new round
  Succeeded,
  Failed,
};
const char* toString(AgentState state);

class ElasticAgent {
 public:
  ElasticAgent(AgentConfig config, std::unique_ptr<rdzv::Rendezvous> rendezvous);
  ~ElasticAgent();
  // Runs the job to the end. Returns the process exit code: 0 on success, the root-cause
  // worker's status code (exit code or 128+signal) on failure, 128+signal when drun itself was
  // signalled.
  int run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace drun::agent

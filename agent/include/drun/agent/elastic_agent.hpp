// ElasticAgent: the node agent's state machine. Joins a rendezvous round, starts the local
// WorkerGroup with the torchrun environment, waits on one event loop for worker exits, membership
// changes and signals, and restarts (budget left) or finishes with a root-cause summary.
//
//   Init -> Rendezvous -> Running -> Succeeded
//                ^           |  \-> Stopping -> Failed
//                |           v
//                +------ Restarting (worker failure with budget left, membership change)
//
// Threading: run() blocks the calling thread and drives everything on its own io_context.
// Ownership: owns the rendezvous, the worker group and the job guard.
#pragma once

#include <memory>
#include <string>

#include "drun/agent/agent_config.hpp"

namespace drun::agent {

enum class AgentState { Init, Rendezvous, Running, Restarting, Stopping, Succeeded, Failed };
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

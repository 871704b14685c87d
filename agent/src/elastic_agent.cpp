#include "drun/agent/elastic_agent.hpp"

namespace drun::agent {
const char* toString(AgentState state) {
  switch (state) {
    case AgentState::Init: return "Init";
    case AgentState::Rendezvous: return "Rendezvous";
    case AgentState::Running: return "Running";
    case AgentState::Restarting: return "Restarting";
    case AgentState::Stopping: return "Stopping";
    case AgentState::Succeeded: return "Succeeded";
    case AgentState::Failed: return "Failed";
  }
  return "?";
}
}  // namespace drun::agent

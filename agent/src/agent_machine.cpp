#include "agent_machine.hpp"

namespace drun::agent {

const char* toString(AgentState state) {
  switch (state) {
    case AgentState::Init: return "Init";
    case AgentState::Rendezvous: return "Rendezvous";
    case AgentState::Running: return "Running";
    case AgentState::Recovering: return "Recovering";
    case AgentState::StoppingForFailure: return "StoppingForFailure";
    case AgentState::Reporting: return "Reporting";
    case AgentState::StoppingForReform: return "StoppingForReform";
    case AgentState::StoppingToExit: return "StoppingToExit";
    case AgentState::Finishing: return "Finishing";
    case AgentState::Reconnecting: return "Reconnecting";
    case AgentState::StoppingForRound: return "StoppingForRound";
    case AgentState::Succeeded: return "Succeeded";
    case AgentState::Failed: return "Failed";
  }
  return "?";
}

namespace detail {

const char* toString(Event e) {
  switch (e) {
    case Event::Start: return "start";
    case Event::RoundFormed: return "round formed";
    case Event::RendezvousFailed: return "rendezvous failed";
    case Event::JobEnded: return "job ended";
    case Event::JobEndedOk: return "job ended, succeeded";
    case Event::WorkerFailed: return "worker failed";
    case Event::WorkersSucceeded: return "workers succeeded";
    case Event::WorkersStopped: return "workers stopped";
    case Event::VerdictRestart: return "verdict: restart";
    case Event::VerdictFinal: return "verdict: final";
    case Event::JobFailed: return "job failed";
    case Event::JobFailedFinal: return "job failed, final";
    case Event::JobSucceeded: return "job succeeded";
    case Event::MemberLost: return "member lost";
    case Event::NodeWaiting: return "node waiting";
    case Event::ScaleUpDue: return "scale-up due";
    case Event::ScaleUpClaimed: return "scale-up claimed";
    case Event::ScaleUpRefused: return "scale-up refused";
    case Event::StoreLost: return "store lost";
    case Event::StoreLostKeepingWorkers: return "store lost, workers kept";
    case Event::StoreRefilled: return "store refilled";
    case Event::StoreKeptJob: return "store kept the job";
    case Event::FenceDue: return "fence due";
    case Event::RoundContinues: return "round continues";
    case Event::RoundChanged: return "round changed";
    case Event::WorkerToReplace: return "worker to replace";
    case Event::RecoveryOpened: return "recovery opened";
    case Event::RecoveryRefused: return "recovery refused";
    case Event::GenerationBegan: return "generation began";
    case Event::RecoveryFormed: return "recovery formed";
    case Event::RecoveryDue: return "recovery due";
    case Event::ReplacementFailed: return "replacement failed";
    case Event::RecoveryFellBack: return "recovery fell back";
    case Event::PeerRecoveryFellBack: return "recovery fell back elsewhere";
    case Event::NodeLost: return "node lost";
    case Event::NodeRecoveryOpened: return "node recovery opened";
    case Event::LossUnrecovered: return "loss unrecovered";
    case Event::GrowWanted: return "grow wanted";
    case Event::GrowthOpened: return "growth opened";
    case Event::Signal: return "signal";
    case Event::WorkersSignalled: return "workers signalled";
    case Event::InternalError: return "internal error";
  }
  return "?";
}

}  // namespace detail
}  // namespace drun::agent

// The elastic agent's cancels: a job ended from outside is cancelled, not failed. Two shapes:
// SIGTERM or SIGINT to drun itself (a shell's Ctrl-C, kill, a scheduler signalling the agent),
// and the same signal to every worker of this node within kCancelWindow (scancel: slurmstepd
// signals the step's processes directly, the workers before drun sees anything). A worker that
// ends by SIGTERM/SIGINT before drun stopped the group opens the window: the exits that follow
// are held until every worker ended (all by that signal: a cancel) or the window passes (a
// failure after all: the held exits go on as they came, a second late).
#include <signal.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "drun/agent/failure_summary.hpp"
#include "elastic_agent_impl.hpp"

namespace drun::agent {
namespace {

constexpr std::chrono::milliseconds kCancelWindow{1000};

bool cancelSignal(int signal) { return signal == SIGTERM || signal == SIGINT; }

}  // namespace

bool ElasticAgent::Impl::holdForCancel(const WorkerExit& exit) {
  if (cancelWindow) {
    cancelWindow->exits.push_back(exit);
    if (exit.signal != cancelWindow->signal) cancelWindow->mixed = true;
    if (group->running() == 0) closeCancelWindowSoon();
    return true;
  }
  if (state != AgentState::Running || exit.afterStop || !cancelSignal(exit.signal)) return false;
  cancelWindow.emplace();
  cancelWindow->signal = exit.signal;
  cancelWindow->exits.push_back(exit);
  spdlog::debug("agent: rank {} ended by {}: waiting up to {} ms for the other workers (a cancel "
                "signals them all)", exit.globalRank, signalName(exit.signal), kCancelWindow.count());
  if (group->running() == 0) {
    closeCancelWindowSoon();
    return true;
  }
  cancelTimer.expires_after(kCancelWindow);
  cancelTimer.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) closeCancelWindow();
  });
  return true;
}

// Decided on the loop after the exit's handler, as every other event.
void ElasticAgent::Impl::closeCancelWindowSoon() {
  cancelTimer.cancel();
  onLoop([this] { closeCancelWindow(); });
}

void ElasticAgent::Impl::closeCancelWindow() {
  if (!cancelWindow) return;  // stopped meanwhile (drun's own signal, the job's news)
  CancelWindow window = std::move(*cancelWindow);
  cancelWindow.reset();
  cancelTimer.cancel();
  if (!window.mixed && group && group->running() == 0) {
    Input in;
    in.signal = window.signal;
    in.reason = signalName(window.signal) + " to every worker";
    dispatch(Event::WorkersSignalled, in);
    return;
  }
  for (const WorkerExit& exit : window.exits) {  // failures after all, in the order they came
    Input in;
    in.exit = exit;
    in.reason = "rank " + std::to_string(exit.globalRank);
    dispatch(recoveryEventFor(exit, in), in);
  }
}

void ElasticAgent::Impl::stopCancelled(const Input& in) {
  signalled = in.signal;
  signalledAt = Clock::now();
  const size_t workers = group ? group->pids().size() : 0;
  cancelledBy = signalName(in.signal) + " to all " + std::to_string(workers) + " worker(s) on " +
                config.hostname + " from outside drun";
  console.say("drun: every worker on {} ended by {} at once, from outside drun (scancel, kill): "
              "the job is cancelled\n", config.hostname, signalName(in.signal));
  stopGroup(in.signal);  // nothing runs: completes at once, and WorkersStopped ends drun
}

void ElasticAgent::Impl::noteCancelBy(int signal) {
  if (cancelSignal(signal) && cancelledBy.empty())
    cancelledBy = signalName(signal) + " to drun (pid " + std::to_string(::getpid()) + ") on " +
                  config.hostname;
}

void ElasticAgent::Impl::noteSignalledEnd() {
  if (cancelledBy.empty()) {
    note("job_failed", {{"code", exitCode}, {"reason", "received " + signalName(signalled)}});
    return;
  }
  console.say("drun: job cancelled: {} (exit code {})\n", cancelledBy, exitCode);
  nlohmann::json fields = {{"round", round.round}, {"code", exitCode},
                           {"signal", signalName(signalled)}, {"by", cancelledBy}};
  // Its name in the round ("host(address)"), as its will names it to the others.
  if (round.nodeRank >= 0 && static_cast<size_t>(round.nodeRank) < round.hosts.size())
    fields["name"] = round.hosts[static_cast<size_t>(round.nodeRank)];
  note("job_cancelled", std::move(fields));
}

}  // namespace drun::agent

#include "event_fields.hpp"

#include <algorithm>

#include "drun/agent/failure_summary.hpp"

namespace drun::agent::detail {
namespace {

constexpr size_t kMaxHosts = 64;
constexpr size_t kMaxStackExcerpt = 1500;

}  // namespace

nlohmann::json failureJson(const rdzv::FailureRecord& f) {
  return {{"rank", f.rank},
          {"local_rank", f.localRank},
          {"node", f.node},
          {"exit_code", f.signal ? nlohmann::json() : nlohmann::json(f.exitCode)},
          {"signal", f.signal ? nlohmann::json(f.signal) : nlohmann::json()},
          {"signal_name", f.signal ? nlohmann::json(signalName(f.signal)) : nlohmann::json()},
          {"status", describeStatus(f)},
          {"pid", f.pid},
          {"time_ms", f.timeMs},
          {"detail_source", f.detailSource},
          {"detail", f.detail.substr(0, 1024)},
          {"other_failures", f.otherFailures},
          {"final", f.final}};
}

nlohmann::json roundFormedFields(const rdzv::RoundResult& r, int localWorkers, int maxRestarts) {
  std::vector<std::string> hosts(r.hosts.begin(),
                                 r.hosts.begin() + std::min(r.hosts.size(), kMaxHosts));
  return {{"round", r.round},
          {"node_rank", r.nodeRank},
          {"node_count", r.nodeCount},
          {"world_size", r.worldSize},
          {"ranks", {r.rankOffset, r.rankOffset + localWorkers - 1}},
          {"master_addr", r.masterAddr},
          {"master_port", r.masterPort},
          {"restart_count", r.restartCount},
          {"max_restarts", maxRestarts},
          {"hosts", hosts}};
}

nlohmann::json workerExitFields(const WorkerExit& exit, uint64_t round) {
  return {{"round", round},
          {"rank", exit.globalRank},
          {"local_rank", exit.localRank},
          {"pid", exit.pid},
          {"code", exit.signal ? nlohmann::json() : nlohmann::json(exit.exitCode)},
          {"signal", exit.signal ? nlohmann::json(exit.signal) : nlohmann::json()},
          {"signal_name", exit.signal ? nlohmann::json(signalName(exit.signal)) : nlohmann::json()},
          {"after_stop", exit.afterStop}};
}

nlohmann::json hangFields(const HangReport& hang, int rank, uint64_t round) {
  return {{"round", round},
          {"rank", rank},
          {"local_rank", hang.localRank},
          {"rule", hang.verdict.rule},
          {"section", hang.verdict.section},
          {"what", hang.verdict.describe()},
          {"stack_how", hang.stackHow},
          {"stack", hang.stackText.substr(0, kMaxStackExcerpt)},
          {"why", hang.blame}};
}

std::vector<std::string> namesNotIn(const std::vector<std::string>& now,
                                    const std::vector<std::string>& before) {
  std::vector<std::string> out;
  for (const auto& name : now)
    if (std::find(before.begin(), before.end(), name) == before.end()) out.push_back(name);
  return out;
}

}  // namespace drun::agent::detail

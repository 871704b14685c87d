#include "job_notes.hpp"

#include <mutex>

#include "event_fields.hpp"

namespace drun::agent::detail {

namespace {

// The node as the others know it: --local-addr tells agents of one host apart.
std::string nodeName(const AgentConfig& config) {
  const std::string& addr = config.rendezvous.localAddr;
  return addr.empty() || addr == config.hostname ? config.hostname
                                                 : config.hostname + "(" + addr + ")";
}

}  // namespace

struct JobNotes::StoreSource {
  std::mutex mutex;
  rdzv::Rendezvous* rendezvous = nullptr;
};

JobNotes::JobNotes(const AgentConfig& config, rdzv::Rendezvous& rendezvous,
                   std::shared_ptr<ConsoleWriter> console)
    : nprocPerNode_(config.nprocPerNode),
      maxRestarts_(config.rendezvous.maxRestarts),
      log_(config.rendezvous.runId, nodeName(config)) {
  if (!config.eventsPath.empty()) log_.add(makeFileEventSink(config.eventsPath, std::move(console)));
  if (!config.jobHistory) return;
  store_ = std::make_shared<StoreSource>();
  store_->rendezvous = &rendezvous;
  log_.add(makeStoreEventSink(
      [source = store_]() -> std::unique_ptr<rdzv::LivenessStore> {
        std::lock_guard lock(source->mutex);
        return source->rendezvous ? source->rendezvous->connectSideStore() : nullptr;
      },
      config.rendezvous.runId));
}

JobNotes::~JobNotes() { detachStore(); }

void JobNotes::detachStore() {
  if (!store_) return;
  std::lock_guard lock(store_->mutex);
  store_->rendezvous = nullptr;
}

void JobNotes::note(std::string_view kind, nlohmann::json fields) {
  log_.emit(kind, std::move(fields));
}

void JobNotes::roundStarted(const rdzv::RoundResult& round, const std::vector<pid_t>& pids,
                            int attempt, const std::vector<bool>& fromStandby) {
  note("round_formed", roundFormedFields(round, nprocPerNode_, maxRestarts_));
  for (size_t i = 0; i < pids.size(); ++i) {
    nlohmann::json fields = {{"round", round.round}, {"rank", round.rankOffset + static_cast<int>(i)},
                             {"local_rank", i}, {"pid", pids[i]}};
    if (i < fromStandby.size()) {
      fields["generation"] = round.generation;
      fields["standby"] = static_cast<bool>(fromStandby[i]);
    }
    note("worker_started", std::move(fields));
  }
  if (attempt == 1 && round.round > 0) note("spare_taken_in", {{"round", round.round}});
  if (memberLostSinceRound_ && round.nodeRank == 0 && !previousHosts_.empty()) {
    auto added = namesNotIn(round.hosts, previousHosts_);
    if (!added.empty())
      note("replacement", {{"round", round.round}, {"new", added},
                           {"lost", namesNotIn(previousHosts_, round.hosts)}});
  }
  previousHosts_ = round.hosts;
  restartCount_ = round.restartCount;
  memberLostSinceRound_ = false;
}

void JobNotes::roundContinued(const rdzv::RoundResult& round, uint64_t fromRound) {
  note("round_formed", roundFormedFields(round, nprocPerNode_, maxRestarts_));
  note("round_continued", {{"round", round.round}, {"from_round", fromRound}});
  previousHosts_ = round.hosts;
  restartCount_ = round.restartCount;
}

void JobNotes::workerExited(const WorkerExit& exit, uint64_t round, const HangReport* hang) {
  note("worker_exited", workerExitFields(exit, round));
  if (hang && !exit.succeeded()) note("hang_detected", hangFields(*hang, exit.globalRank, round));
}

void JobNotes::rootCause(const rdzv::FailureRecord& cause, const rdzv::RoundResult& round) {
  const auto key = std::make_tuple(round.round, cause.rank, int64_t{cause.pid}, cause.timeMs);
  if (lastCause_ == key) return;
  lastCause_ = key;
  note("failure_recorded", {{"round", round.round}, {"failure", failureJson(cause)}});
  if (!cause.final)
    note("restart", {{"round", round.round}, {"count", round.restartCount + 1},
                     {"max_restarts", maxRestarts_},
                     {"budget_left", maxRestarts_ - round.restartCount - 1}});
}

void JobNotes::jobEvent(const rdzv::JobEvent& e) {
  using Kind = rdzv::JobEvent::Kind;
  if (e.kind == Kind::MemberLost) {
    memberLostSinceRound_ = true;
    note("node_lost", {{"round", e.round}, {"reason", e.reason}});
  }
  if (e.kind == Kind::NodeWaiting) note("node_waiting", {{"round", e.round}, {"reason", e.reason}});
  if (e.kind == Kind::StoreLost) note("store_lost", {{"round", e.round}, {"reason", e.reason}});
  if (e.kind == Kind::Failed && e.failure) {
    rdzv::RoundResult round;
    round.round = e.round;
    round.restartCount = restartCount_;
    rootCause(*e.failure, round);
  }
}

}  // namespace drun::agent::detail

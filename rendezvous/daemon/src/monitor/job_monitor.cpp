#include "job_monitor.hpp"

#include <algorithm>
#include <charconv>

#include "drun/rendezvous/job_history.hpp"
#include "drun/rendezvous/keys.hpp"

namespace drun::rdzv::monitor {
namespace {

constexpr std::string_view kRoot = "rdzv/";

bool parseRound(std::string_view text, uint64_t& out) {
  if (text.empty() || text.size() > 19) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

constexpr size_t kMaxExitsPerRound = 64;

// What ends a round as far as the page tells: its time is the round's end.
bool endsRound(const std::string& kind) {
  return kind == "failure_recorded" || kind == "node_lost" || kind == "restart" || kind == "job_succeeded" ||
         kind == "job_failed" || kind == "job_cancelled" || kind == "store_lost";
}

// Adds to each round of a summary its end time, its workers' exits and its nodes' names.
void addRoundDetails(nlohmann::json& rounds, const std::deque<nlohmann::json>& events) {
  std::map<int64_t, nlohmann::json*> byRound;
  for (nlohmann::json& r : rounds) {
    r["ended_ts_ms"] = nullptr;
    r["exits"] = nlohmann::json::array();
    byRound[r["round"].get<int64_t>()] = &r;
  }
  for (const nlohmann::json& e : events) {
    auto round = e.find("round");
    if (round == e.end() || !round->is_number_integer()) continue;
    auto it = byRound.find(round->get<int64_t>());
    if (it == byRound.end()) continue;
    nlohmann::json& r = *it->second;
    const std::string kind = e.value("event", "");
    auto ts = e.find("ts_ms");
    if (endsRound(kind) && ts != e.end() && ts->is_number_integer() &&
        (r["ended_ts_ms"].is_null() || r["ended_ts_ms"].get<int64_t>() < ts->get<int64_t>()))
      r["ended_ts_ms"] = *ts;
    if (kind == "worker_exited" && r["exits"].size() < kMaxExitsPerRound)
      r["exits"].push_back({{"rank", e.value("rank", nlohmann::json())}, {"node", e.value("node", nlohmann::json())},
                            {"code", e.value("code", nlohmann::json())},
                            {"signal_name", e.value("signal_name", nlohmann::json())}});
    auto hosts = e.find("hosts");
    auto nodeRank = e.find("node_rank");
    if (kind == "round_formed" && hosts != e.end() && hosts->is_array() && nodeRank != e.end() &&
        nodeRank->is_number_integer())
      for (nlohmann::json& n : r["nodes"]) {
        const int64_t rank = n["node_rank"].get<int64_t>();
        if (rank >= 0 && size_t(rank) < hosts->size() && (*hosts)[size_t(rank)].is_string())
          n["name"] = (*hosts)[size_t(rank)];
      }
  }
}

}  // namespace

JobMonitor::Job* JobMonitor::jobOf(const std::string& runId) {
  auto it = jobs_.find(runId);
  if (it != jobs_.end()) return &it->second;
  if (jobs_.size() >= kMaxTrackedJobs) return nullptr;
  return &jobs_[runId];
}

void JobMonitor::onWrite(const std::string& key, const Bytes* value) {
  if (!std::string_view(key).starts_with(kRoot)) return;
  const size_t slash = key.find('/', kRoot.size());
  if (slash == std::string::npos || slash == kRoot.size()) return;
  const std::string runId = key.substr(kRoot.size(), slash - kRoot.size());
  const std::string_view rest = std::string_view(key).substr(slash + 1);
  if (!value) {  // a deletion: the job's end (its keys go at once) or an old round's cleanup
    if (rest == "round") {
      auto it = jobs_.find(runId);
      if (it != jobs_.end() && it->second.present) {
        it->second.present = false;
        it->second.endedAt = std::chrono::steady_clock::now();
        forgetEnded();
      }
    }
    return;
  }
  Job* job = jobOf(runId);
  if (!job) return;
  if (!job->present) {
    job->present = true;  // the same id started again
    job->events.clear();
    job->outcome.clear();
    job->counters = {};
  }
  if (rest.starts_with("events/") && rest != "events/next") return onEvent(*job, *value);
  if (rest == "outcome") {
    try {
      if (!keys::isOutcomeReset(*value)) job->outcome = keys::parseOutcome(*value) ? "failed" : "succeeded";
    } catch (const std::exception&) {
    }
    return;
  }
  const size_t cut = rest.find('/');
  uint64_t round = 0;
  if (cut != std::string_view::npos && parseRound(rest.substr(0, cut), round))
    onRoundKey(*job, round, std::string(rest.substr(cut + 1)), value);
}

void JobMonitor::onEvent(Job& job, const Bytes& value) {
  nlohmann::json event = nlohmann::json::parse(value, nullptr, false);
  if (!isJobEvent(event)) return;
  auto seq = event.find("seq");
  if (seq == event.end() || !seq->is_number_unsigned()) return;
  const uint64_t n = seq->get<uint64_t>();
  auto at = std::find_if(job.events.begin(), job.events.end(),
                         [&](const nlohmann::json& e) { return e["seq"].get<uint64_t>() >= n; });
  if (at != job.events.end() && (*at)["seq"].get<uint64_t>() == n) return;  // known
  if (event["event"] == "job_cancelled") ++job.cancels;
  job.counters.onEvent(event);
  job.events.insert(at, std::move(event));
  while (job.events.size() > keys::kEventSlots) job.events.pop_front();
}

void JobMonitor::onRoundKey(Job& job, uint64_t round, const std::string& leaf, const Bytes* value) {
  const auto now = std::chrono::steady_clock::now();
  if (leaf == "count") {
    job.opened.emplace(round, now);  // the first joiner's add; later adds keep the first time
    while (job.opened.size() > 8) job.opened.erase(job.opened.begin());
    return;
  }
  if (leaf != "state") return;
  std::optional<keys::RoundState> state;
  try {
    state = keys::parseState(*value);
  } catch (const std::exception&) {
    return;
  }
  if (!state) return;
  ++job.roundsClosed;
  if (state->ok) {
    job.restarts = state->restartCount;
    job.nodes = state->nodeCount;
    job.worldSize = state->worldSize;
  }
  auto opened = job.opened.find(round);
  if (opened == job.opened.end()) return;
  const double seconds = std::chrono::duration<double>(now - opened->second).count();
  job.opened.erase(opened);
  for (size_t i = 0; i < kCloseBuckets.size(); ++i)
    if (seconds <= kCloseBuckets[i]) ++closeBuckets_[i];
  closeSum_ += seconds;
  ++closeCount_;
}

void JobMonitor::forgetEnded() {
  std::vector<std::map<std::string, Job>::iterator> ended;
  for (auto it = jobs_.begin(); it != jobs_.end(); ++it)
    if (!it->second.present) ended.push_back(it);
  if (ended.size() <= kMaxEndedJobs) return;
  std::sort(ended.begin(), ended.end(), [](auto a, auto b) { return a->second.endedAt < b->second.endedAt; });
  for (size_t i = 0; i + kMaxEndedJobs < ended.size(); ++i) jobs_.erase(ended[i]);
}

nlohmann::json JobMonitor::summary(const std::string& runId, const Job& job) const {
  nlohmann::json s = summarizeJob(runId, std::vector<nlohmann::json>(job.events.begin(), job.events.end()));
  s["present"] = job.present;
  s["rounds_closed"] = job.roundsClosed;
  s["restarts_decided"] = job.restarts;
  if (s["events"] == 0 && job.nodes > 0) {  // no history (DRUN_JOB_HISTORY=0): the decision's view
    s["node_count"] = job.nodes;
    s["world_size"] = job.worldSize;
    s["restarts"] = job.restarts;
    s["state"] = !job.outcome.empty() ? job.outcome : job.present ? "running" : "ended";
  }
  addRoundDetails(s["rounds"], job.events);
  for (const nlohmann::json& r : s["rounds"])
    if (r["round"] == s["round"]) s["nodes"] = r["nodes"];  // with their names
  s["first_ts_ms"] = job.events.empty() ? nlohmann::json() : job.events.front().value("ts_ms", nlohmann::json());
  return s;
}

nlohmann::json JobMonitor::jobsJson() const {
  nlohmann::json jobs = nlohmann::json::array();
  for (const auto& [id, job] : jobs_) jobs.push_back(summary(id, job));
  return {{"jobs", jobs}};
}

}  // namespace drun::rdzv::monitor

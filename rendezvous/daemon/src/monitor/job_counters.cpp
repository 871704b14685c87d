#include "job_counters.hpp"

namespace drun::rdzv::monitor {
namespace {

std::optional<int64_t> roundOfEvent(const nlohmann::json& event) {
  auto it = event.find("round");
  if (it == event.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

}  // namespace

std::string JobCounters::causeBefore(int64_t round) const {
  auto it = rounds_.lower_bound(round);  // the latest earlier round with events
  if (it == rounds_.begin()) return "other";
  const RoundSeen& seen = std::prev(it)->second;
  if (seen.failure) return "failure";
  if (seen.lost) return "node_lost";
  if (seen.waiting) return "scale_up";
  if (seen.storeLost) return "store_lost";
  return "other";
}

void JobCounters::onEvent(const nlohmann::json& event) {
  auto kind = event.find("event");
  if (kind == event.end() || !kind->is_string()) return;
  const std::string& k = kind->get_ref<const std::string&>();
  if (k == "hang_detected") ++hangs_;
  const auto round = roundOfEvent(event);
  if (!round || *round < 0) return;
  if (k == "round_formed") {
    if (latestFormed_ >= 0 && *round > latestFormed_) ++restarts_[causeBefore(*round)];
    if (*round > latestFormed_) latestFormed_ = *round;
  }
  RoundSeen& seen = rounds_[*round];
  if (k == "failure_recorded") seen.failure = true;
  if (k == "node_waiting") seen.waiting = true;
  if (k == "store_lost") seen.storeLost = true;
  if (k == "node_lost") {
    seen.lost = true;
    auto reason = event.find("reason");
    std::string why = reason != event.end() && reason->is_string() ? reason->get<std::string>() : "";
    if (losses_.emplace(*round, std::move(why)).second) ++lostNodes_;
    while (losses_.size() > kLossesKept) losses_.erase(losses_.begin());
  }
  while (rounds_.size() > kRoundsKept) rounds_.erase(rounds_.begin());
}

}  // namespace drun::rdzv::monitor

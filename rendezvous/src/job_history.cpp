// The job's history in the store and its summary. See job_history.hpp.
#include "drun/rendezvous/job_history.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "drun/rendezvous/keys.hpp"

namespace drun::rdzv {
namespace {

using nlohmann::json;

// Untrusted fields: the value when present with the expected type, else nothing.
std::optional<int64_t> number(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

std::string text(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// The event shortened to kMaxEventBytes: long strings (a stack, an error's detail) are cut.
void fitEvent(json& event) {
  for (size_t cap : {1024u, 256u, 64u}) {
    if (event.dump().size() <= kMaxEventBytes) return;
    for (auto& [key, value] : event.items()) {
      if (value.is_string() && value.get_ref<const std::string&>().size() > cap)
        value = value.get<std::string>().substr(0, cap) + "...";
      if (value.is_object())
        for (auto& [k, v] : value.items())
          if (v.is_string() && v.get_ref<const std::string&>().size() > cap)
            v = v.get<std::string>().substr(0, cap) + "...";
    }
  }
}

// A cancelled node leaves as a lost one (its will): that loss is the cancel, not a lost node.
void forgetCancelledLosses(std::map<int64_t, json>& rounds, const json& cancelled) {
  for (auto& [r, R] : rounds) {
    json kept = json::array();
    for (const json& reason : R["lost"]) {
      bool cancel = false;
      for (const json& c : cancelled) {
        const std::string& name = c["name"].get_ref<const std::string&>();
        const std::string who = "node " + (name.empty() ? c["node"].get<std::string>() : name) + " ";
        cancel = cancel || (reason.is_string() && reason.get_ref<const std::string&>().starts_with(who));
      }
      if (!cancel) kept.push_back(reason);
    }
    R["lost"] = std::move(kept);
  }
}

}  // namespace

bool isJobEvent(const json& event) {
  return event.is_object() && number(event, "v") == kEventSchemaVersion &&
         !text(event, "event").empty();
}

void appendJobEvents(Store& store, std::string_view runId, std::vector<json> events) {
  if (events.empty()) return;
  const int64_t count = static_cast<int64_t>(std::min<size_t>(events.size(), keys::kEventSlots));
  events.erase(events.begin(), events.end() - count);  // more than the ring holds: the last ones
  const int64_t first = store.add(keys::eventCount(runId), count) - count;
  std::vector<std::string> slots;
  std::vector<Bytes> lines;
  for (int64_t i = 0; i < count; ++i) {
    json& event = events[static_cast<size_t>(i)];
    fitEvent(event);
    event["seq"] = first + i;
    slots.push_back(keys::eventSlot(runId, static_cast<uint64_t>(first + i)));
    lines.push_back(event.dump(-1, ' ', false, json::error_handler_t::replace));
  }
  store.multiSet(slots, lines);
}

std::vector<json> readJobHistory(Store& store, std::string_view runId, size_t* skipped) {
  std::vector<json> out;
  auto count = store.tryGet(keys::eventCount(runId));
  if (!count) return out;
  int64_t n = 0;
  try {
    n = std::stoll(std::string(count->begin(), count->end()));
  } catch (const std::exception&) {
    return out;
  }
  const int64_t first = std::max<int64_t>(0, n - static_cast<int64_t>(keys::kEventSlots));
  for (int64_t seq = first; seq < n; ++seq) {
    auto value = store.tryGet(keys::eventSlot(runId, static_cast<uint64_t>(seq)));
    if (!value) continue;
    json event = json::parse(value->begin(), value->end(), nullptr, false);
    if (!isJobEvent(event) || number(event, "seq") != seq) {
      if (skipped && !event.is_discarded() && !number(event, "seq")) ++*skipped;
      continue;
    }
    out.push_back(std::move(event));
  }
  return out;
}

json summarizeJob(std::string_view runId, const std::vector<json>& events) {
  json s = {{"run_id", std::string(runId)}, {"state", "forming"}, {"round", nullptr},
            {"world_size", 0}, {"node_count", 0}, {"nodes", json::array()}, {"restarts", 0},
            {"max_restarts", nullptr}, {"budget_left", nullptr}, {"last_root_cause", nullptr},
            {"waiting", json::array()}, {"hung", json::array()}, {"rounds", json::array()},
            {"events", events.size()}, {"last_ts_ms", nullptr}, {"recoveries", json::array()},
            {"cancelled", json::array()}};
  std::map<int64_t, json> rounds;
  std::map<std::string, std::pair<bool, std::string>> joining;  // agent -> (its latest word is
                                                                // "joining", its node)
  std::optional<int64_t> current;
  std::string ended;
  int64_t cancelledIn = 0;  // while `ended` is "cancelled": the round the cancel ended
  auto roundOf = [&](int64_t r) -> json& {
    json& R = rounds[r];
    if (R.is_null())
      R = {{"round", r}, {"ts_ms", nullptr}, {"world_size", 0}, {"node_count", 0}, {"nodes", json::array()},
           {"failure", nullptr}, {"restart", false}, {"lost", json::array()},
           {"taken_in", json::array()}, {"recoveries", json::array()}};
    return R;
  };
  auto recoveryOf = [](json& R, int64_t generation) -> json& {
    for (json& r : R["recoveries"])
      if (r["generation"] == generation) return r;
    R["recoveries"].push_back({{"generation", generation}, {"lost_ranks", json::array()},
                               {"outcome", "recovering"}, {"ms", nullptr}});
    return R["recoveries"].back();
  };
  for (const json& e : events) {
    if (!isJobEvent(e)) continue;
    const std::string kind = text(e, "event");
    const std::string node = text(e, "node");
    // Agents of one host (tests, a spare beside a member) share a name: their pid tells them apart.
    const std::string agent = node + "#" + std::to_string(number(e, "agent_pid").value_or(0));
    if (auto ts = number(e, "ts_ms")) s["last_ts_ms"] = *ts;
    const auto round = number(e, "round");
    if (kind == "node_joining") joining[agent] = {true, node};
    if (kind == "round_formed" && round && *round >= 0) {
      joining[agent] = {false, node};
      json& R = roundOf(*round);
      if (R["ts_ms"].is_null()) R["ts_ms"] = number(e, "ts_ms").value_or(0);
      R["world_size"] = number(e, "world_size").value_or(0);
      R["node_count"] = number(e, "node_count").value_or(0);
      json entry = {{"node", node}, {"node_rank", number(e, "node_rank").value_or(-1)},
                    {"ranks", e.contains("ranks") && e["ranks"].is_array() ? e["ranks"] : json::array()}};
      R["nodes"].push_back(entry);
      if (ended == "cancelled" && *round > cancelledIn)
        ended.clear();  // one node was cancelled (it left): the others went on without it
      if (!current || *round >= *current) {
        current = *round;
        s["restarts"] = number(e, "restart_count").value_or(0);
        if (auto m = number(e, "max_restarts")) s["max_restarts"] = *m;
      }
    }
    if (kind == "failure_recorded" && round) {
      auto f = e.find("failure");
      if (f != e.end() && f->is_object()) {
        roundOf(*round)["failure"] = *f;
        s["last_root_cause"] = *f;
      }
    }
    if (kind == "restart" && round) {
      roundOf(*round)["restart"] = true;
      if (auto b = number(e, "budget_left")) s["budget_left"] = *b;
    }
    if (kind == "node_lost" && round) roundOf(*round)["lost"].push_back(text(e, "reason"));
    // In-process recoveries: every agent notes each generation; the first note makes the entry.
    if ((kind == "recovery_started" || kind == "recovery_formed" || kind == "recovery_fallback") && round) {
      const auto generation = number(e, "generation");
      if (!generation) continue;
      json& recovery = recoveryOf(roundOf(*round), *generation);
      if (kind == "recovery_started") {
        if (e.contains("lost") && e["lost"].is_array())
          for (const json& l : e["lost"])
            if (auto rank = number(l, "rank"); rank && recovery["lost_ranks"].size() < 64 &&
                                                std::find(recovery["lost_ranks"].begin(),
                                                          recovery["lost_ranks"].end(), *rank) ==
                                                    recovery["lost_ranks"].end())
              recovery["lost_ranks"].push_back(*rank);
        if (auto count = number(e, "restart_count"); count && current && *round == *current)
          s["restarts"] = std::max(number(s, "restarts").value_or(0), *count);
      }
      if (kind == "recovery_formed") {
        recovery["outcome"] = "formed";
        recovery["ms"] = number(e, "ms").value_or(-1);
      }
      if (kind == "recovery_fallback") recovery["outcome"] = "fallback: " + text(e, "reason");
    }
    if ((kind == "spare_taken_in" || kind == "replacement") && round)
      roundOf(*round)["taken_in"].push_back(kind == "replacement" ? e.value("new", json::array()) : json(node));
    if (kind == "hang_detected")
      s["hung"].push_back({{"rank", number(e, "rank").value_or(-1)}, {"node", node},
                           {"section", text(e, "section")}, {"round", round.value_or(-1)}});
    if (kind == "job_succeeded") ended = "succeeded";
    if (kind == "job_failed" && ended.empty()) ended = "failed";
    if (kind == "job_cancelled") {
      if (s["cancelled"].size() < 64)
        s["cancelled"].push_back({{"node", node}, {"name", text(e, "name")}, {"by", text(e, "by")},
                                  {"round", round.value_or(-1)}});
      if (ended.empty()) {
        ended = "cancelled";
        cancelledIn = round.value_or(-1);
      }
    }
  }
  forgetCancelledLosses(rounds, s["cancelled"]);
  for (auto& [r, R] : rounds) {
    std::sort(R["nodes"].begin(), R["nodes"].end(), [](const json& a, const json& b) {
      return a["node_rank"].get<int64_t>() < b["node_rank"].get<int64_t>();
    });
    s["rounds"].push_back(R);
  }
  if (current) {
    const json& R = rounds[*current];
    s["round"] = *current;
    s["world_size"] = R["world_size"];
    s["node_count"] = R["node_count"];
    s["nodes"] = R["nodes"];
    s["state"] = R["failure"].is_null() && R["lost"].empty() ? "running" : "restarting";
    if (s["state"] == "running" && !R["recoveries"].empty() && R["recoveries"].back()["outcome"] == "recovering")
      s["state"] = "recovering";
    s["recoveries"] = R["recoveries"];
    json hung = json::array();
    for (const json& h : s["hung"])
      if (h["round"] == *current) hung.push_back(h);
    s["hung"] = hung;
  }
  if (!ended.empty()) s["state"] = ended;
  for (const auto& [agent, state] : joining)
    if (state.first && ended.empty()) s["waiting"].push_back(state.second);
  return s;
}

std::string describeJob(const json& s) {
  auto show = [](const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
  std::string out = "job " + show(s["run_id"]) + ": " + show(s["state"]) + "\n";
  out += "  round: " + show(s["round"]) + ", world size " + show(s["world_size"]) + ", " +
         show(s["node_count"]) + " node(s)\n";
  for (const json& n : s["nodes"]) {
    out += "    node " + show(n["node_rank"]) + ": " + show(n["node"]);
    if (n["ranks"].is_array() && n["ranks"].size() == 2)
      out += " (ranks " + show(n["ranks"][0]) + "-" + show(n["ranks"][1]) + ")";
    out += "\n";
  }
  out += "  restarts: " + show(s["restarts"]) + " of " +
         (s["max_restarts"].is_null() ? std::string("?") : show(s["max_restarts"])) + "\n";
  if (s.contains("recoveries") && s["recoveries"].is_array() && !s["recoveries"].empty()) {
    const json& last = s["recoveries"].back();
    std::string ranks;
    for (const json& r : last["lost_ranks"]) ranks += (ranks.empty() ? "" : ", ") + show(r);
    out += "  recoveries in place this round: " + std::to_string(s["recoveries"].size()) +
           " (last: generation " + show(last["generation"]) + ", rank(s) " +
           (ranks.empty() ? std::string("?") : ranks) + ", " + show(last["outcome"]) +
           (last["ms"].is_number() ? " in " + show(last["ms"]) + " ms" : std::string()) + ")\n";
  }
  if (s["state"] == "cancelled" && s.contains("cancelled") && s["cancelled"].is_array()) {
    std::string by;
    for (const json& c : s["cancelled"]) by += (by.empty() ? "" : "; ") + show(c["by"]);
    out += "  cancelled: " + by + "\n";
  }
  const json& f = s["last_root_cause"];
  if (f.is_object()) {
    out += "  last root cause: rank " + show(f.value("rank", json(-1))) + " on " +
           show(f.value("node", json(""))) + ": " + show(f.value("status", json(""))) + "\n";
  } else {
    out += "  last root cause: none\n";
  }
  std::string waiting;
  for (const json& w : s["waiting"]) waiting += (waiting.empty() ? "" : ", ") + show(w);
  out += "  waiting (spares, late joiners): " + (waiting.empty() ? std::string("none") : waiting) + "\n";
  std::string hung;
  for (const json& h : s["hung"])
    hung += (hung.empty() ? "" : ", ") + std::string("rank ") + show(h["rank"]) + " on " +
            show(h["node"]) + (h["section"].get<std::string>().empty() ? "" : " in " + show(h["section"]));
  out += "  hung ranks: " + (hung.empty() ? std::string("none") : hung) + "\n";
  return out;
}

}  // namespace drun::rdzv

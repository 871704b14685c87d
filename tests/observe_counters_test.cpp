// The daemon's per-job counters for /metrics (rendezvous/daemon/src/monitor/job_counters.hpp):
// each loss and each restart counted once however many members wrote it, restarts by what ended
// the round before, hangs.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "../rendezvous/daemon/src/monitor/job_counters.hpp"

using drun::rdzv::monitor::JobCounters;
using nlohmann::json;

namespace {

json countedEvent(const std::string& kind, json round, json fields = json::object()) {
  fields["event"] = kind;
  fields["round"] = std::move(round);
  return fields;
}

}  // namespace

TEST_CASE("JobCounters: each member's note of one loss and one restart counts once, by cause", "[observe]") {
  JobCounters c;
  for (const char* node : {"a", "b"}) c.onEvent(countedEvent("round_formed", 0, {{"node", node}}));
  CHECK(c.restartsByCause().at("failure") == 0);
  for (int member = 0; member < 2; ++member) c.onEvent(countedEvent("failure_recorded", 0));
  for (int member = 0; member < 2; ++member) c.onEvent(countedEvent("round_formed", 1));
  CHECK(c.restartsByCause().at("failure") == 1);
  // Round 1 loses node c: both survivors say so; round 2 forms without it.
  for (int member = 0; member < 2; ++member) c.onEvent(countedEvent("node_lost", 1, {{"reason", "node c: lease expired"}}));
  c.onEvent(countedEvent("node_lost", 1, {{"reason", "node d: connection closed"}}));
  for (int member = 0; member < 2; ++member) c.onEvent(countedEvent("round_formed", 2));
  CHECK(c.lostNodes() == 2);
  CHECK(c.restartsByCause().at("node_lost") == 1);
  // A node waits: the job scales up; then the store is lost and the round re-forms.
  c.onEvent(countedEvent("node_waiting", 2, {{"reason", "e waits"}}));
  c.onEvent(countedEvent("round_formed", 3));
  c.onEvent(countedEvent("store_lost", 3));
  c.onEvent(countedEvent("round_formed", 4));
  c.onEvent(countedEvent("round_continued", 4));
  c.onEvent(countedEvent("round_formed", 5));  // nothing said why
  CHECK(c.restartsByCause().at("scale_up") == 1);
  CHECK(c.restartsByCause().at("store_lost") == 1);
  CHECK(c.restartsByCause().at("other") == 1);
  CHECK(c.restartsByCause().at("failure") == 1);
  // A late member's note of an older round's formation is no restart.
  c.onEvent(countedEvent("round_formed", 3));
  CHECK(c.restartsByCause().at("other") == 1);
  c.onEvent(countedEvent("hang_detected", 5, {{"rank", 3}}));
  CHECK(c.hangs() == 1);
}

TEST_CASE("JobCounters: events of the wrong shape are ignored", "[observe]") {
  JobCounters c;
  c.onEvent(json::array());
  c.onEvent(json{{"event", 3}, {"round", 1}});
  c.onEvent(countedEvent("node_lost", "one", {{"reason", "x"}}));
  c.onEvent(countedEvent("node_lost", -1, {{"reason", "x"}}));
  c.onEvent(countedEvent("node_lost", 0, {{"reason", json::array()}}));
  c.onEvent(countedEvent("round_formed", 0));
  c.onEvent(countedEvent("round_formed", json(nullptr)));
  CHECK(c.lostNodes() == 1);  // round 0, no reason
  CHECK(c.restartsByCause().at("other") == 0);
}

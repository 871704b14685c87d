// The job's history in the store (job_history.hpp, keys::eventSlot) and the ListJobs op.
#include <catch2/catch.hpp>

#include "drun/common/error.hpp"
#include "drun/rendezvous/job_history.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/store/memory_store.hpp"
#include "drun/store/store_server.hpp"
#include "drun/store/tcp_store.hpp"
#include "server_test_support.hpp"

using namespace drun::rdzv;
using namespace drun::rdzv::test;
using nlohmann::json;

namespace {

json event(const std::string& kind, json fields = json::object()) {
  json e = {{"v", 1}, {"event", kind}, {"ts_ms", 1}, {"run_id", "j"}, {"node", "n0"}};
  e.update(fields);
  return e;
}

}  // namespace

TEST_CASE("job history: the last 256 events in order, each with its seq", "[history]") {
  MemoryStore store;
  for (int i = 0; i < 300; ++i) appendJobEvent(store, "j", event("worker_started", {{"rank", i}}));
  const auto events = readJobHistory(store, "j");
  REQUIRE(events.size() == keys::kEventSlots);
  for (size_t i = 0; i < events.size(); ++i) {
    CHECK(events[i]["seq"] == 300 - keys::kEventSlots + i);
    CHECK(events[i]["rank"] == 300 - keys::kEventSlots + i);
  }
  CHECK(keys::eventSlot("j", 3) == "rdzv/j/events/3");
  CHECK(keys::eventSlot("j", 259) == "rdzv/j/events/3");
  CHECK(keys::runIdOfEventSlot("rdzv/j/events/3") == "j");
  CHECK(!keys::runIdOfEventSlot("rdzv/j/events/next"));
  CHECK(!keys::runIdOfEventSlot("rdzv/j/x/events/3"));
  CHECK(!keys::runIdOfEventSlot("other/j/events/3"));
}

TEST_CASE("job history: what another client wrote there is skipped, never thrown", "[history]") {
  MemoryStore store;
  appendJobEvent(store, "j", event("round_formed", {{"round", 0}, {"world_size", 2}, {"node_count", 1},
                                                    {"ranks", {0, 1}}, {"node_rank", 0}}));
  store.set(keys::eventSlot("j", 1), "not json");
  store.set(keys::eventSlot("j", 2), R"({"v":1,"event":"restart","seq":7})");  // another seq
  store.set(keys::eventCount("j"), "4");
  store.set(keys::eventSlot("j", 3), R"({"v":1,"event":"round_formed","seq":3,"round":"x","ranks":5,"node_rank":[]})");
  std::vector<json> events;
  REQUIRE_NOTHROW(events = readJobHistory(store, "j"));
  REQUIRE(events.size() == 2);
  json s;
  REQUIRE_NOTHROW(s = summarizeJob("j", events));
  CHECK(s["round"] == 0);
  CHECK(s["world_size"] == 2);
  CHECK(s["state"] == "running");
  store.set(keys::eventCount("j"), "-5x");
  CHECK(readJobHistory(store, "j").empty());
  // Wrong types everywhere: a summary all the same.
  std::vector<json> hostile = {event("failure_recorded", {{"round", 0}, {"failure", 3}}),
                               event("hang_detected", {{"rank", "x"}, {"section", 5}}),
                               event("node_lost", {{"round", -1}, {"reason", json::array()}}),
                               json::array(), json("x")};
  REQUIRE_NOTHROW(s = summarizeJob("j", hostile));
  REQUIRE_NOTHROW(describeJob(s));
}

TEST_CASE("job history: the summary of a job that failed once and restarted", "[history]") {
  std::vector<json> events = {
      event("node_joining", {{"round", nullptr}}),
      event("round_formed", {{"round", 0}, {"world_size", 2}, {"node_count", 1}, {"node_rank", 0},
                             {"ranks", {0, 1}}, {"restart_count", 0}, {"max_restarts", 3}}),
      event("failure_recorded", {{"round", 0}, {"failure", {{"rank", 1}, {"node", "n0"}, {"status", "exit code 3"}}}}),
      event("restart", {{"round", 0}, {"count", 1}, {"budget_left", 2}}),
      event("node_joining", {{"round", 0}}),
      event("round_formed", {{"round", 1}, {"world_size", 2}, {"node_count", 1}, {"node_rank", 0},
                             {"ranks", {0, 1}}, {"restart_count", 1}, {"max_restarts", 3}}),
      event("node_joining", {{"round", nullptr}, {"node", "spare1"}}),
      event("hang_detected", {{"round", 1}, {"rank", 0}, {"section", "step"}}),
  };
  const json s = summarizeJob("j", events);
  CHECK(s["state"] == "running");
  CHECK(s["round"] == 1);
  CHECK(s["restarts"] == 1);
  CHECK(s["max_restarts"] == 3);
  CHECK(s["budget_left"] == 2);
  CHECK(s["last_root_cause"]["status"] == "exit code 3");
  CHECK(s["waiting"] == json::array({"spare1"}));
  REQUIRE(s["hung"].size() == 1);
  CHECK(s["hung"][0]["section"] == "step");
  REQUIRE(s["rounds"].size() == 2);
  CHECK(s["rounds"][0]["restart"] == true);
  CHECK(s["rounds"][0]["failure"]["rank"] == 1);
  const std::string text = describeJob(s);
  CHECK(text.find("restarts: 1 of 3") != std::string::npos);
  CHECK(text.find("last root cause: rank 1 on n0: exit code 3") != std::string::npos);
  CHECK(text.find("waiting (spares, late joiners): spare1") != std::string::npos);
  CHECK(text.find("hung ranks: rank 0 on n0 in step") != std::string::npos);
  events.push_back(event("job_succeeded", {{"round", 1}}));
  CHECK(summarizeJob("j", events)["state"] == "succeeded");
  CHECK(summarizeJob("j", events)["waiting"].empty());
}

TEST_CASE("job history: in-process recoveries count as restarts and show in the summary", "[history]") {
  std::vector<json> events = {
      event("round_formed", {{"round", 0}, {"world_size", 4}, {"node_count", 2}, {"node_rank", 0},
                             {"ranks", {0, 1}}, {"restart_count", 0}, {"max_restarts", 3}}),
      // Every agent notes a generation that begins; the summary keeps one entry per generation.
      event("recovery_started", {{"round", 0}, {"generation", 1}, {"restart_count", 1},
                                 {"lost", json::array({{{"rank", 3}}})}}),
      event("recovery_started", {{"round", 0}, {"generation", 1}, {"restart_count", 1},
                                 {"lost", json::array({{{"rank", 3}}})}}),
  };
  json s = summarizeJob("j", events);
  CHECK(s["state"] == "recovering");
  CHECK(s["restarts"] == 1);
  REQUIRE(s["recoveries"].size() == 1);
  CHECK(s["recoveries"][0]["lost_ranks"] == json::array({3}));
  events.push_back(event("recovery_formed", {{"round", 0}, {"generation", 1}, {"ms", 310}}));
  s = summarizeJob("j", events);
  CHECK(s["state"] == "running");
  CHECK(s["recoveries"][0]["outcome"] == "formed");
  CHECK(describeJob(s).find("recoveries in place this round: 1 (last: generation 1, rank(s) 3, formed in 310 ms)") !=
        std::string::npos);
  events.push_back(event("recovery_started", {{"round", 0}, {"generation", 2}, {"restart_count", 2},
                                              {"lost", "not a list"}}));
  events.push_back(event("recovery_fallback", {{"round", 0}, {"generation", 2},
                                               {"reason", "the survivors never joined the recovery"}}));
  events.push_back(event("recovery_formed", {{"round", 0}, {"generation", "x"}}));  // skipped
  s = summarizeJob("j", events);
  CHECK(s["restarts"] == 2);
  REQUIRE(s["recoveries"].size() == 2);
  CHECK(s["recoveries"][1]["outcome"] == "fallback: the survivors never joined the recovery");
  CHECK(s["rounds"][0]["recoveries"].size() == 2);
}

TEST_CASE("ListJobs: the run ids with keys, refused to a client of one job", "[history]") {
  const std::string token(32, 't');
  auto server = startServer([&](StoreServerOptions& o) {
    o.token = token;
    o.jobTokens["a"] = std::string(32, 'a');
  });
  TcpStoreOptions admin = clientOptions(server->port());
  admin.token = token;
  TcpStore store(admin);
  CHECK(store.listJobs().empty());
  store.set("rdzv/b/round", "1");
  store.set("rdzv/a/events/next", "1");
  store.set("outside", "x");
  CHECK(store.listJobs() == std::vector<std::string>{"a", "b"});
  TcpStoreOptions jobA = clientOptions(server->port());
  jobA.token = std::string(32, 'a');
  jobA.scope = "a";
  TcpStore scoped(jobA);
  CHECK_THROWS_AS(scoped.listJobs(), drun::InvalidArgument);
  store.deleteKey("rdzv/b/round");
  CHECK(store.listJobs() == std::vector<std::string>{"a"});
}

TEST_CASE("job history: a cancelled job: its state, who was signalled, no lost node for the "
          "cancelled nodes, and a later round without the node is running again", "[history]") {
  auto formed = [](int round, const std::string& node) {
    return event("round_formed", {{"round", round}, {"world_size", 2}, {"node_count", 2},
                                  {"node_rank", node == "n0" ? 0 : 1}, {"node", node}});
  };
  std::vector<json> events = {
      formed(0, "n0"), formed(0, "n1"),
      event("job_cancelled", {{"round", 0}, {"node", "n1"}, {"name", "n1(10.0.0.2)"},
                              {"by", "SIGTERM to drun (pid 7) on n1"}, {"code", 143}}),
      event("node_lost", {{"round", 0}, {"reason", "node n1(10.0.0.2) left round 0 (its connection closed)"}}),
      event("node_lost", {{"round", 0}, {"reason", "node n2(10.0.0.3) left round 0 (its connection closed)"}}),
      event("job_cancelled", {{"round", 0}, {"node", "n0"}, {"by", "SIGTERM to all 2 worker(s) on n0"}}),
      event("job_failed", {{"code", 1}}),
  };
  json s = summarizeJob("j", events);
  CHECK(s["state"] == "cancelled");
  REQUIRE(s["cancelled"].size() == 2);
  CHECK(s["cancelled"][0]["by"] == "SIGTERM to drun (pid 7) on n1");
  CHECK(s["rounds"][0]["lost"] == json::array({"node n2(10.0.0.3) left round 0 (its connection closed)"}));
  const std::string text = describeJob(s);
  CHECK(text.find("job j: cancelled\n") != std::string::npos);
  CHECK(text.find("  cancelled: SIGTERM to drun (pid 7) on n1; SIGTERM to all 2 worker(s) on n0\n") !=
        std::string::npos);

  // One node cancelled, the others went on without it: the job is not cancelled.
  events.resize(3);
  events.push_back(formed(1, "n0"));
  s = summarizeJob("j", events);
  CHECK(s["state"] == "running");
  CHECK(s["cancelled"].size() == 1);
}

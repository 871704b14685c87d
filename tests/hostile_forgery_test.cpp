// Hostile clients against a drun-rendezvous daemon: rendezvous state forged while an open store's
// job joins (between its first agent's arrival and its second's). The forgeries may legitimately
// break that job, so its two nodes must end cleanly: success, or exit 1 with a clear error, never
// a crash, a hang or a MASTER_ADDR that is not a host or address (hostile_client_test.cpp says
// more).
#include <set>
#include <thread>

#include <catch2/catch.hpp>
#include <csignal>
#include <string>
#include <vector>

#include "drun/common/test_skip.hpp"
#include "hostile_clients.hpp"
#include "process.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/store/tcp_store.hpp"

using namespace drun::test;
using namespace drun::test::hostile;
using namespace std::chrono_literals;

TEST_CASE("hostile clients: state forged while an open store's job joins ends the job cleanly",
          "[e2e][hostile]") {
  MarkerScope marker;
  Daemon daemon({});
  const long fds0 = openFds(daemon.pid());

  // A node nobody runs: a well-formed descriptor with no agent (and so no will) behind it.
  keys::NodeDescriptor phantom;
  phantom.id = "phantom-" + randomHex(8);
  phantom.host = "phantom";
  phantom.addr = "127.0.0.77";
  phantom.localWorldSize = 2;
  phantom.masterPort = 29999;
  // A round-0 decision naming the job's first agent and the phantom.
  auto decisionWith = [&](const keys::NodeDescriptor& first, const std::string& masterAddr) {
    keys::RoundState state;
    state.nodeCount = 2;
    state.worldSize = 4;
    state.masterAddr = masterAddr;
    state.masterPort = 29500;
    state.roster = {{first.id, first.displayName(), 2}, {phantom.id, phantom.displayName(), 2}};
    return state;
  };
  auto forgeDecision = [](drun::rdzv::TcpStore& s, const std::string& id, const keys::RoundState& state) {
    s.compareSet(keys::state(id, 0), "", keys::encodeState(state));
    s.set(keys::status(id, 0), keys::encodeState(state, false));  // wakes the waiting agent
  };

  // Each forgery is written once the job's first agent has arrived in round 0 (`first`: its
  // descriptor, as the store holds it), before the second agent starts.
  enum class Expect {
    Success,   // the rendezvous tolerates it: the job still forms and succeeds
    CleanEnd,  // success, or exit 1 with a clear error
    // A made-up member: on an open store it cannot be told from a real node whose workers are
    // still busy (anyone who reaches the port can be a node; the defence is a token), so the
    // job waits for it as for a slow node: the first agent in its exit barrier, the second a
    // spare. The wait must be a clean one, and SIGTERM must end it at once.
    WaitsForPhantom,
  };
  struct JoinForgery {
    std::string name;
    Expect expect;
    std::function<void(drun::rdzv::TcpStore&, const std::string&, const keys::NodeDescriptor&)> write;
  };
  using Store = drun::rdzv::TcpStore;
  using Node = keys::NodeDescriptor;
  const std::vector<JoinForgery> forgeries = {
      {"round = 7", Expect::CleanEnd,
       [](Store& s, const std::string& id, const Node&) { s.set(keys::currentRound(id), "7"); }},
      {"round = garbage", Expect::CleanEnd,
       [](Store& s, const std::string& id, const Node&) { s.set(keys::currentRound(id), "\x01\x02 nope"); }},
      {"garbage lines in joined + count bumped", Expect::Success,
       [](Store& s, const std::string& id, const Node&) {
         s.append(keys::joined(id, 0), "\x1b[2J\tevil;rm -rf /\t\t\nx\ty\tevil;rm\t2\t-\t29500\t-\n" +
                                           std::string(8192, 'A') + "\n");
         s.add(keys::count(id, 0), 3);
       }},
      {"a torn line in joined (no newline)", Expect::CleanEnd,
       [](Store& s, const std::string& id, const Node&) { s.append(keys::joined(id, 0), "torn\tline"); }},
      {"changes + 1000 / status + 1 / 1 MiB last_change", Expect::Success,
       [](Store& s, const std::string& id, const Node&) {
         s.add(keys::changes(id, 0), 1000);
         s.set(keys::lastChange(id, 0), "\x1b[2J" + std::string(1 << 20, 'B') + "\r\x07");
         s.add(keys::status(id, 0), 1);
       }},
      {"count = garbage", Expect::CleanEnd,
       [](Store& s, const std::string& id, const Node&) { s.set(keys::count(id, 0), "\x1b[2J many"); }},
      {"status = garbage", Expect::CleanEnd,
       [](Store& s, const std::string& id, const Node&) { s.set(keys::status(id, 0), "\x1b[2J\tok\t"); }},
      {"changes = -1 / left = -1", Expect::CleanEnd,
       [](Store& s, const std::string& id, const Node&) {
         s.add(keys::changes(id, 0), -1);
         s.add(keys::left(id, 0), -1);
       }},
      {"outcome = succeeded", Expect::Success,  // before any round closed: not believed
       [](Store& s, const std::string& id, const Node&) {
         s.set(keys::outcome(id), keys::encodeOutcome(std::nullopt));
         s.add(keys::status(id, 0), 1);
       }},
      {"dead flag of the first node", Expect::CleanEnd,
       [](Store& s, const std::string& id, const Node& first) {
         s.set(keys::dead(id, 0, first.id), "1");
         s.add(keys::changes(id, 0), 1);
         s.add(keys::status(id, 0), 1);
       }},
      {"assignment and host list ahead of the close", Expect::Success,
       [](Store& s, const std::string& id, const Node& first) {
         s.set(keys::assign(id, 0, first.id), "7\t\x1b[2J");
         s.set(keys::hosts(id, 0), "=evil;rm -rf /\n=\x1b[2J\n");
       }},
      {"config = --nnodes 3", Expect::CleanEnd,
       [](Store& s, const std::string& id, const Node&) {
         s.set(keys::config(id), keys::encodeJobConfig({3, 3, "evil"}));
       }},
      {"decision with MASTER_ADDR 'evil;rm -rf /'", Expect::CleanEnd,
       [&](Store& s, const std::string& id, const Node& first) {
         forgeDecision(s, id, decisionWith(first, "evil;rm -rf /"));
       }},
      {"a phantom node in joined", Expect::WaitsForPhantom,
       [&](Store& s, const std::string& id, const Node&) {
         s.append(keys::joined(id, 0), keys::encodeDescriptor(phantom));
         s.add(keys::count(id, 0), 1);
       }},
      {"decision naming the first node and a phantom", Expect::WaitsForPhantom,
       [&](Store& s, const std::string& id, const Node& first) {
         forgeDecision(s, id, decisionWith(first, phantom.addr));
       }},
  };
  for (const JoinForgery& forgery : forgeries) {
    INFO(forgery.name);
    const std::string id = "joining-" + randomHex(6);
    JobHooks hooks;
    hooks.betweenAgents = [&] {
      Store forger(storeOptions(daemon.port));
      forger.get(keys::count(id, 0), 15s);  // the first agent arrived (it appends to joined first)
      auto joined = keys::parseJoined(forger.get(keys::joined(id, 0), 5s));
      REQUIRE(joined.size() == 1);
      forgery.write(forger, id, joined.front());
    };
    bool waited = false;
    if (forgery.expect == Expect::WaitsForPhantom) {
      hooks.whileRunning = [&](Process& first, Process& second) {
        auto says = [](Process& p, const std::string& text) {
          return p.waitForOutput(
              [&](const std::string&, const std::string& err) { return err.find(text) != std::string::npos; },
              20s);
        };
        const bool inBarrier = says(first, "waiting for the other 1 node(s) of the job");
        const bool spare = says(second, "waits as a spare");
        waited = inBarrier && spare;
        first.signal(SIGTERM);
        second.signal(SIGTERM);
      };
    }
    JobResult job = runJob(daemon.port, id, "is_host=0,join_timeout=5", marker, hooks);
    std::string outcome;
    if (forgery.expect == Expect::WaitsForPhantom) {
      INFO(job.describe());
      CHECK(waited);
      std::multiset<int> ranks;
      std::set<std::string> masters;
      parseJob(job.a.out, ranks, masters);
      CHECK(ranks.size() == 2);  // the first agent's workers ran (and ended), beside the phantom's
      CHECK(masters.size() == 1);
      for (const std::string& m : masters) CHECK(keys::isHostOrAddress(m));
      for (const RunResult* r : {&job.a, &job.b}) {
        CHECK(!r->timedOut);
        CHECK(r->status() == 128 + SIGTERM);
      }
      outcome = std::string(waited ? "waited (exit barrier / spare)" : "did NOT wait as expected") +
                ", then SIGTERM: exit " + std::to_string(job.a.status()) + " / " +
                std::to_string(job.b.status());
    } else {
      outcome = checkJobEndsCleanly(job);
      if (forgery.expect == Expect::Success) checkJobSucceeded(job);
    }
    report("forged while joining: " + forgery.name, outcome);
  }

  CHECK(daemon.alive());
  drun::rdzv::TcpStore check(storeOptions(daemon.port));
  check.set("hostile/final", "ok");
  CHECK(check.get("hostile/final", 5s) == "ok");
  CHECK(openFds(daemon.pid()) <= fds0 + 4);
  CHECK(marker.leftovers(5s).empty());
  daemon.process->signal(SIGTERM);
  CHECK(daemon.process->wait(10s).status() == 0);
}

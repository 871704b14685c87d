// Multi-node drun on loopback (no namespaces needed): the c10d rendezvous as users meet it —
// a join that times out, a node whose job fails while another's succeeds, and agents meeting at a
// standalone drun-rendezvous daemon.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <set>
#include <thread>

#include "process.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

uint16_t freePort() { return freeLoopbackPort(); }

std::vector<std::string> agentArgs(uint16_t port, const std::string& id, std::vector<std::string> extra) {
  std::vector<std::string> args = {"--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint",
                                   "127.0.0.1:" + std::to_string(port), "--rdzv-id", id};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::set<int> ranksPrinted(const std::string& out) {
  std::set<int> ranks;
  for (const ConsoleLine& line : parseConsole(out))
    if (line.text.rfind("RANK=", 0) == 0) ranks.insert(std::stoi(line.text.substr(5)));
  return ranks;
}

// Two agents of one job on this host, started together, run to the end.
struct TwoAgents {
  RunResult a, b;
  TwoAgents(uint16_t port, const std::string& id, const std::vector<std::string>& extra,
            const std::vector<std::string>& env = {}) {
    Process pa(drunCommand(agentArgs(port, id, extra), env, 30s));
    Process pb(drunCommand(agentArgs(port, id, extra), env, 30s));
    a = pa.wait();
    b = pb.wait();
  }
  std::string describe() const { return a.describe() + "\n" + b.describe(); }
  // Every rank printed by either agent, each exactly once (a duplicate fails the check).
  std::set<int> ranks() const {
    std::set<int> all = ranksPrinted(a.out);
    for (int rank : ranksPrinted(b.out)) CHECK(all.insert(rank).second);
    return all;
  }
};

}  // namespace

TEST_CASE("rendezvous: a join that times out fails with exit 1 naming who joined", "[e2e][rendezvous]") {
  auto args = agentArgs(freePort(), "lonely-" + randomHex(6),
                        {"--rdzv-conf", "join_timeout=1", "/bin/true"});
  RunResult r = run(drunCommand(args, {}, 30s));
  INFO(r.describe());
  CHECK(r.status() == 1);
  CHECK_THAT(r.err, Catch::Contains("drun: error: rendezvous failed"));
  CHECK_THAT(r.err, Catch::Contains("timed out"));
  CHECK_THAT(r.err, Catch::Contains("1 node(s) joined"));
  CHECK_THAT(r.err, Catch::Contains("need 2"));
}

TEST_CASE("rendezvous: one node's failure ends the job on every node with one root cause",
          "[e2e][rendezvous]") {
  uint16_t port = freePort();
  std::string id = "split-" + randomHex(6);
  // Both nodes run the same program: global rank 3 fails with 3 once every other rank has
  // printed (so the failure cannot stop one before its line, as it could were rank 3 to wait for
  // its node-mate only); the other ranks run a while (the other node is then
  // either still running or waiting in the exit barrier: either way it ends).
  TempDir marks;
  std::vector<std::string> program = {
      "sh", "-c",
      "echo RANK=$RANK; touch $MARKS/$RANK; if [ $RANK = 3 ]; then "
      "for i in $(seq 1000); do [ -e $MARKS/0 ] && [ -e $MARKS/1 ] && [ -e $MARKS/2 ] && break; sleep 0.01; done; "
      "exit 3; fi; sleep 0.3"};
  TwoAgents job(port, id, program, {"MARKS=" + marks.path().string()});
  INFO(job.describe());
  CHECK(job.ranks() == std::set<int>{0, 1, 2, 3});
  // Budget 0: every agent exits with the root cause's code and prints the same summary.
  for (const RunResult* r : {&job.a, &job.b}) {
    CHECK(r->status() == 3);
    CHECK_THAT(r->err, Catch::Contains("drun: root cause: rank 3 (local_rank 1) on "));
    CHECK_THAT(r->err, Catch::Contains("exited with code 3"));
  }
}

TEST_CASE("rendezvous: agents meet at a standalone drun-rendezvous daemon", "[e2e][rendezvous]") {
  Process daemon(RunOptions{{(buildDir() / "bin" / "drun-rendezvous").string(), "--host", "127.0.0.1",
                             "--port", "0"}, {}, {}, 60s});
  REQUIRE(daemon.waitForOutput(
      [](const std::string& out, const std::string&) { return out.find("listening on") != std::string::npos; },
      10s));
  std::string out;
  daemon.waitForOutput([&](const std::string& o, const std::string&) { out = o; return true; }, 1s);
  auto colon = out.rfind(':');
  REQUIRE(colon != std::string::npos);
  uint16_t port = static_cast<uint16_t>(std::stoi(out.substr(colon + 1)));

  std::string id = "daemon-" + randomHex(6);
  std::vector<std::string> extra = {"--rdzv-conf", "is_host=0", "sh", "-c", "echo RANK=$RANK WORLD=$WORLD_SIZE"};
  TwoAgents job(port, id, extra);
  INFO(job.describe());
  CHECK(job.a.status() == 0);
  CHECK(job.b.status() == 0);
  CHECK(job.ranks() == std::set<int>{0, 1, 2, 3});
  CHECK_THAT(job.a.out + job.b.out, Catch::Contains("WORLD=4"));
  daemon.signal(SIGTERM);
  CHECK(daemon.wait(10s).status() == 0);
}

TEST_CASE("rendezvous: long waits are said at a steady pace and not as a flood", "[e2e][rendezvous]") {
  SECTION("a node waiting for the others") {
    const uint16_t port = freePort();
    auto args = agentArgs(port, "wait-" + randomHex(6),
                          {"--rdzv-conf", "join_timeout=3500ms,progress_interval=1s", "/bin/true"});
    RunResult r = run(drunCommand(args, {}, 30s));
    INFO(r.describe());
    CHECK(r.status() == 1);
    const std::string line = "drun: waiting for 1 more node(s) (1/2 joined at ";
    // One after 1 s, then one a second: 3 within 3.5 s (a slow machine may drop one).
    CHECK(countLinesWith(r.err, line) >= 2);
    CHECK(countLinesWith(r.err, line) <= 4);
    CHECK_THAT(r.err, Catch::Contains("s left"));
  }
  SECTION("an unreachable store") {
    const uint16_t port = freePort();  // nothing serves it: connections are refused
    auto args = agentArgs(port, "unreach-" + randomHex(6),
                          {"--rdzv-conf", "is_host=0,join_timeout=2500ms,progress_interval=1s", "/bin/true"});
    RunResult r = run(drunCommand(args, {}, 30s));
    INFO(r.describe());
    CHECK(r.status() == 1);
    const std::string line = "drun: cannot reach the rendezvous store at 127.0.0.1:" + std::to_string(port) + " yet";
    CHECK(countLinesWith(r.err, line) >= 1);
    CHECK(countLinesWith(r.err, line) <= 3);
  }
  SECTION("a finished node waiting for the rest") {
    const uint16_t port = freePort();
    const std::string id = "barrier-" + randomHex(6);
    // Node ranks follow arrival here (one host): whichever node holds rank 0 finishes at once,
    // the other runs 2.5 s.
    std::vector<std::string> extra = {"--rdzv-conf", "progress_interval=1s", "sh", "-c",
                                      "[ $GROUP_RANK = 0 ] || sleep 2.5"};
    Process pa(drunCommand(agentArgs(port, id, extra), {}, 30s));
    Process pb(drunCommand(agentArgs(port, id, extra), {}, 30s));
    RunResult a = pa.wait(), b = pb.wait();
    INFO(a.describe() << "\n" << b.describe());
    CHECK(a.status() == 0);
    CHECK(b.status() == 0);
    const int lines = countLinesWith(a.err + b.err, "drun: still waiting for the other node(s) of the job to finish");
    CHECK(lines >= 1);
    CHECK(lines <= 3);
  }
}

TEST_CASE("rendezvous: agents started with different --nnodes fail at once naming both",
          "[e2e][rendezvous]") {
  const uint16_t port = freePort();
  const std::string id = "mismatch-" + randomHex(6);
  auto endpoint = "127.0.0.1:" + std::to_string(port);
  Process a(drunCommand({"--nnodes", "2", "--rdzv-endpoint", endpoint, "--rdzv-id", id, "/bin/true"}, {}, 30s));
  // The second starts once the first hosts the store (it would otherwise race to host it).
  std::this_thread::sleep_for(500ms);
  const auto t0 = std::chrono::steady_clock::now();
  Process b(drunCommand({"--nnodes", "3", "--rdzv-endpoint", endpoint, "--rdzv-id", id, "/bin/true"}, {}, 30s));
  RunResult rb = b.wait();
  RunResult ra = a.wait();
  INFO(ra.describe() << "\n" << rb.describe());
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);  // the join timeout is 600 s
  for (const RunResult* r : {&ra, &rb}) {
    CHECK(r->status() == 1);
    CHECK_THAT(r->err, Catch::Contains("nodes disagree on --nnodes"));
    CHECK_THAT(r->err, Catch::Contains("has --nnodes 3"));
    CHECK_THAT(r->err, Catch::Contains("has --nnodes 2"));
  }
}

TEST_CASE("rendezvous: the classic static torchrun line runs a two-node job", "[e2e][rendezvous]") {
  const uint16_t port = freePort();
  auto node = [&](int rank) {
    return drunCommand({"--nnodes=2", "--node_rank=" + std::to_string(rank), "--master_addr=127.0.0.1",
                        "--master_port=" + std::to_string(port), "--nproc_per_node=2", "sh", "-c",
                        "echo RANK=$RANK; echo WORLD=$WORLD_SIZE MASTER=$MASTER_ADDR:$MASTER_PORT"},
                       {}, 30s);
  };
  Process p0(node(0)), p1(node(1));
  RunResult r0 = p0.wait(), r1 = p1.wait();
  INFO(r0.describe() << "\n" << r1.describe());
  CHECK(r0.status() == 0);
  CHECK(r1.status() == 0);
  CHECK(ranksPrinted(r0.out) == std::set<int>{0, 1});
  CHECK(ranksPrinted(r1.out) == std::set<int>{2, 3});
  CHECK_THAT(r0.out + r1.out, Catch::Contains("WORLD=4 MASTER=127.0.0.1:" + std::to_string(port)));
}

TEST_CASE("rendezvous: the same nodes keep their node ranks across restarts", "[e2e][rendezvous]") {
  const uint16_t port = freePort();
  const std::string id = "stable-" + randomHex(6);
  // One worker per node; the job fails twice (rank 0, restarts 0 and 1) and succeeds on the third
  // round. Node 1 re-joins at once and node 0 only after 200 ms: arrival order (the tie-break on
  // one host) would give node 1 rank 0 in the next round.
  std::vector<std::string> extra = {
      "--nproc-per-node", "1", "--max-restarts", "2", "sh", "-c",
      "echo G=$GROUP_RANK; if [ $GROUP_RANK = 0 ] && [ $TORCHELASTIC_RESTART_COUNT -lt 2 ]; then "
      "sleep 0.2; exit 1; fi; sleep 0.5"};
  auto args = [&] {
    std::vector<std::string> a = {"--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:" + std::to_string(port),
                                  "--rdzv-id", id};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  Process pa(drunCommand(args(), {}, 60s));
  Process pb(drunCommand(args(), {}, 60s));
  RunResult a = pa.wait(), b = pb.wait();
  INFO(a.describe() << "\n" << b.describe());
  CHECK(a.status() == 0);
  CHECK(b.status() == 0);
  for (const RunResult* r : {&a, &b}) {
    std::set<std::string> ranks;
    int rounds = 0;
    for (const ConsoleLine& line : parseConsole(r->out))
      if (line.text.rfind("G=", 0) == 0) {
        ranks.insert(line.text);
        ++rounds;
      }
    CHECK(rounds == 3);
    CHECK(ranks.size() == 1);  // one node rank in every round
  }
}

TEST_CASE("rendezvous: two nodes sharing a --log-dir never write the same file", "[e2e][rendezvous]") {
  TempDir logs;
  const std::string id = "shared-" + randomHex(6);
  TwoAgents job(freePort(), id, {"--log-dir", logs.path().string(), "sh", "-c", "echo RANK=$RANK"});
  INFO(job.describe());
  REQUIRE(job.a.status() == 0);
  REQUIRE(job.b.status() == 0);
  // DIR/<run id>/node<N>/attempt_0/<local rank>/stdout.log: one file per global rank.
  std::set<std::string> seen;
  for (int node = 0; node < 2; ++node)
    for (int local = 0; local < 2; ++local) {
      const auto file = logs.path() / id / ("node" + std::to_string(node)) / "attempt_0" /
                        std::to_string(local) / "stdout.log";
      INFO(file);
      std::ifstream in(file);
      REQUIRE(in);
      std::string line;
      std::getline(in, line);
      CHECK(line == "RANK=" + std::to_string(node * 2 + local));
      seen.insert(line);
    }
  CHECK(seen.size() == 4);
}

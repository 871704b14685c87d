// Multi-node drun on loopback (no namespaces needed): the c10d rendezvous as users meet it —
// a join that times out, a node whose job fails while another's succeeds, and agents meeting at a
// standalone drun-rendezvous daemon.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <set>

#include "process.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

// A port nothing listens on right now (the kernel's pick; closed again at once).
uint16_t freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

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
  // Both nodes run the same program: global rank 3 fails with 3 once its node-mate rank 2 has
  // printed (so the failure cannot stop rank 2 before that); the other ranks run a while (the
  // other node is then either still running or waiting in the exit barrier: either way it ends).
  TempDir marks;
  std::vector<std::string> program = {
      "sh", "-c",
      "echo RANK=$RANK; touch $MARKS/$RANK; if [ $RANK = 3 ]; then "
      "for i in $(seq 1000); do [ -e $MARKS/2 ] && break; sleep 0.01; done; exit 3; fi; sleep 0.3"};
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

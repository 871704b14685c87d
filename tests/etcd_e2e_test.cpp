// drun with --rdzv-backend etcd on a 3-member etcd cluster on loopback (scripts/etcd/up.sh; the
// tests skip where etcd is not installed): a job forms and succeeds, survives a member's death,
// re-forms without a lost node (with c10d the store's host taking the store with it), and every
// agent fences itself when etcd is gone altogether.
#include <signal.h>

#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <set>
#include <nlohmann/json.hpp>
#include <thread>

#include "../rendezvous/tests/etcd_cluster.hpp"
#include "process.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

// heartbeat_timeout is the lease TTL: 3 s (a leader election, 0.5-1 s here, fits in it).
std::vector<std::string> agentArgs(const EtcdCluster& etcd, const std::string& nnodes,
                                   const std::string& id, std::vector<std::string> program,
                                   const std::string& lastCall = "0",
                                   const std::string& extraConf = "") {
  std::vector<std::string> args = {"--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "etcd",
                                   "--rdzv-endpoint", etcd.list(), "--rdzv-id", id, "--max-restarts", "1",
                                   "--rdzv-conf", "heartbeat_timeout=3,join_timeout=20,last_call_timeout=" + lastCall + extraConf};
  args.insert(args.end(), program.begin(), program.end());
  return args;
}

// A worker that says READY, then waits for $GO (bounded), unless it is alone in its round.
std::vector<std::string> waitingWorker() {
  return {"sh", "-c",
          "echo RANK=$RANK WS=$WORLD_SIZE READY; [ \"$WORLD_SIZE\" = 1 ] && exit 0; "
          "i=0; while [ ! -e \"$GO\" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; "
          "[ -e \"$GO\" ]"};
}

// Two agents of a 2-node job whose workers wait for $GO: both rounds running when constructed.
struct WaitingJob {
  EtcdCluster etcd;
  MarkerScope marker;
  TempDir dir;
  std::string go = "GO=" + (dir / "go").string();
  std::unique_ptr<Process> a, b;
  std::string id;
  explicit WaitingJob(const std::string& name, const std::string& extraConf = "") {
    id = name + "-" + randomHex(6);
    const auto args = agentArgs(etcd, "2", id, waitingWorker(), "0", extraConf);
    a = std::make_unique<Process>(drunCommand(args, {marker.env(), go}, 40s));
    b = std::make_unique<Process>(drunCommand(args, {marker.env(), go}, 40s));
    REQUIRE(a->waitForLines("READY", 1, 20s));
    REQUIRE(b->waitForLines("READY", 1, 20s));
  }
};

// A 2-node job whose workers print their rank; `during` runs while the agents join.
void twoNodeJobSucceeds(const std::string& name, const std::function<void(EtcdCluster&)>& during) {
  EtcdCluster etcd;
  MarkerScope marker;
  const std::string id = name + "-" + randomHex(6);
  const std::vector<std::string> program = {"sh", "-c", "echo RANK=$RANK of $WORLD_SIZE"};
  Process a(drunCommand(agentArgs(etcd, "2", id, program), {marker.env()}, 40s));
  Process b(drunCommand(agentArgs(etcd, "2", id, program), {marker.env()}, 40s));
  during(etcd);
  RunResult ra = a.wait(), rb = b.wait();
  INFO(ra.describe() << "\n" << rb.describe());
  CHECK(ra.status() == 0);
  CHECK(rb.status() == 0);
  CHECK_THAT(ra.out + rb.out, Catch::Contains("RANK=0 of 2") && Catch::Contains("RANK=1 of 2"));
  CHECK(marker.leftovers(5s).empty());
}

}  // namespace

TEST_CASE("etcd e2e: a 2-node job forms on the 3-member cluster and succeeds", "[e2e][etcd]") {
  twoNodeJobSucceeds("etcd-ok", [](EtcdCluster&) {});
}

TEST_CASE("etcd e2e: the etcd leader killed while the round closes: the job forms and succeeds",
          "[e2e][etcd]") {
  twoNodeJobSucceeds("etcd-leader", [](EtcdCluster& etcd) {
    const int leader = etcd.leader();
    REQUIRE(leader >= 0);
    etcd.kill(leader);  // the agents are joining: the election falls inside their round
  });
}

TEST_CASE("etcd e2e: an etcd member killed mid-job: the job goes on undisturbed", "[e2e][etcd]") {
  WaitingJob job("etcd-member");
  job.etcd.kill(0);  // a member some of the agents' connections talk to (each starts on a random one)
  // Not a synchronisation: the job must run on for longer than the lease TTL (an agent that
  // lost its lease would have fenced its workers by then).
  std::this_thread::sleep_for(4s);
  job.dir.write("go", "");
  RunResult ra = job.a->wait(), rb = job.b->wait();
  INFO(ra.describe() << "\n" << rb.describe());
  CHECK(ra.status() == 0);
  CHECK(rb.status() == 0);
  CHECK_THAT(ra.out + rb.out, !Catch::Contains("WS=1"));  // never re-formed
}

TEST_CASE("etcd e2e: the first node (c10d's store host) killed: the survivor re-forms and ends",
          "[e2e][etcd]") {
  EtcdCluster etcd;
  MarkerScope marker;
  TempDir dir;
  const std::string go = "GO=" + (dir / "go").string();
  const std::string id = "etcd-host-" + randomHex(6);
  // The last call (5 s) lets the first round take both nodes.
  Process first(drunCommand(agentArgs(etcd, "1:2", id, waitingWorker(), "5"), {marker.env(), go}, 40s));
  Process second(drunCommand(agentArgs(etcd, "1:2", id, waitingWorker(), "5"), {marker.env(), go}, 40s));
  REQUIRE(first.waitForLines("WS=2 READY", 1, 20s));
  REQUIRE(second.waitForLines("WS=2 READY", 1, 20s));
  const auto killed = std::chrono::steady_clock::now();
  first.signal(SIGKILL);  // its workers go with it (parent-death signal); its lease ends
  RunResult rs = second.wait(30s);
  INFO(rs.describe());
  CHECK(rs.status() == 0);
  CHECK_THAT(rs.out, Catch::Contains("WS=1 READY"));  // the new round, alone
  CHECK(std::chrono::steady_clock::now() - killed < 15s);
  first.wait(5s);
}

TEST_CASE("etcd e2e: etcd entirely gone: every agent stops its workers within the lease TTL "
          "and exits with a clear error", "[e2e][etcd]") {
  // $GO is never created. The agents stop their workers within the TTL, then look for etcd
  // again for reconnect_timeout (2 s here; 30 s by default) before they give up.
  WaitingJob job("etcd-gone", ",reconnect_timeout=2");
  const auto killed = std::chrono::steady_clock::now();
  job.etcd.killAll();
  RunResult ra = job.a->wait(25s), rb = job.b->wait(25s);
  INFO(ra.describe() << "\n" << rb.describe());
  for (const RunResult* r : {&ra, &rb}) {
    CHECK_FALSE(r->timedOut);
    CHECK(r->status() != 0);
    CHECK_THAT(r->err, Catch::Contains("etcd"));
  }
  // Workers stopped: fenced within the TTL (3 s) plus the stop's grace; gone with the agents.
  CHECK(std::chrono::steady_clock::now() - killed < 20s);
  CHECK(job.marker.leftovers(5s).empty());
}

TEST_CASE("etcd e2e: drun status reads the job from etcd, running and ended", "[e2e][etcd]") {
  WaitingJob job("etcd-status");
  auto status = [&](std::vector<std::string> more) {
    std::vector<std::string> args = {"status", "--rdzv-backend", "etcd", "--rdzv-endpoint", job.etcd.list()};
    args.insert(args.end(), more.begin(), more.end());
    return run(drunCommand(args, {}, 20s));
  };
  RunResult listed = status({});
  INFO(listed.describe());
  CHECK(listed.status() == 0);
  CHECK_THAT(listed.out, Catch::Contains(job.id) && Catch::Contains("running"));
  RunResult one = status({"--rdzv-id", job.id, "--json"});
  INFO(one.describe());
  REQUIRE(one.status() == 0);
  auto j = nlohmann::json::parse(one.out);
  CHECK(j["node_count"] == 2);
  CHECK(j["world_size"] == 2);
  CHECK(j["state"] == "running");
  job.dir.write("go", "");
  CHECK(job.a->wait().status() == 0);
  CHECK(job.b->wait().status() == 0);
  RunResult ended = status({"--rdzv-id", job.id, "--json"});
  INFO(ended.describe());
  REQUIRE(ended.status() == 0);
  CHECK(nlohmann::json::parse(ended.out)["state"] == "succeeded");
  RunResult missing = status({"--rdzv-id", "no-such-job"});
  CHECK(missing.status() == 1);
  CHECK_THAT(missing.err, Catch::Contains("no job 'no-such-job'"));
}

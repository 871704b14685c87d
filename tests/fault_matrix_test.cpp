// The elastic core's fault matrix: real drun agents on network-namespace hosts (scripts/netns.sh),
// the c10d rendezvous over TCP, and one fault each: a worker failing (on the store host's node,
// on another), a worker SIGKILLed or ignoring SIGTERM, the budget spent, an agent SIGKILLed, a
// link cut (and back), a node joining, a spare, the store host finishing first or dying,
// SIGTERM to one agent or to all, a malformed error file. Each case checks every agent's exit
// code, the WORLD_SIZE / RANK / TORCHELASTIC_RESTART_COUNT the workers of each round saw, the
// summary, and that nothing of the job is left on any host. SKIPPED without namespaces.
// The cases that do not depend on where the store lives run twice: "fault matrix over etcd: ..."
// puts the rendezvous on a 3-member etcd cluster on three more namespace hosts (SKIPPED without
// etcd).
//
// The worker is a shell script (cheap to start): it prints its place, then does what FM_PLAN
// says for its (rank, restart count), else waits until the test creates FM_DIR/release.
#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <thread>

#include "../rendezvous/etcd/tests/etcd_cluster.hpp"
#include "drun/common/test_skip.hpp"
#include "netns.hpp"
#include "process.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

constexpr auto kAgentTimeout = 60s;  // hang guard of one agent
constexpr auto kSeen = 20s;          // hang guard of "the workers of a round started"

const char* kWorker = R"SH(
echo "FM host=$FM_HOST rank=$RANK world=$WORLD_SIZE restart=$TORCHELASTIC_RESTART_COUNT"
touch "$FM_DIR/up-$TORCHELASTIC_RESTART_COUNT-$WORLD_SIZE-$RANK"
act=
for item in $FM_PLAN; do
  case "$item" in
    "$RANK:$TORCHELASTIC_RESTART_COUNT:"*|"*:$TORCHELASTIC_RESTART_COUNT:"*|"$RANK:*:"*) act=${item#*:*:} ;;
  esac
done
# A fault waits until every worker of its round printed its line (so the round is complete in
# the output however fast the fault stops the others).
case "$act" in
  exit*|kill|badfile)
    i=0
    while [ "$(ls "$FM_DIR" | grep -c "^up-$TORCHELASTIC_RESTART_COUNT-$WORLD_SIZE-")" -lt "$WORLD_SIZE" ] && [ $i -lt 400 ]; do
      sleep 0.05; i=$((i+1))
    done ;;
esac
case "$act" in
  exit*) exit "${act#exit}" ;;
  kill) kill -9 $$ ;;
  done) exit 0 ;;
  ignoreterm) trap '' TERM ;;
  badfile) printf '{"message":{"message":1}}' > "$TORCHELASTIC_ERROR_FILE"; exit 1 ;;
esac
i=0
while [ ! -e "$FM_DIR/release" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
exit 0
)SH";

struct Seen {
  int host, rank, world, restart;
};

// The "FM ..." lines of one agent's output.
std::vector<Seen> seen(const std::string& out) {
  static const std::regex re(R"(FM host=(\d+) rank=(\d+) world=(\d+) restart=(\d+))");
  std::vector<Seen> lines;
  for (const auto& l : parseConsole(out)) {
    std::smatch m;
    if (std::regex_search(l.text, m, re))
      lines.push_back({std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3]), std::stoi(m[4])});
  }
  return lines;
}

// The ranks the workers of one round (world size, restart count) printed on all agents.
std::multiset<int> ranksOf(const std::vector<const std::string*>& outs, int world, int restart) {
  std::multiset<int> ranks;
  for (const std::string* out : outs)
    for (const Seen& s : seen(*out))
      if (s.world == world && s.restart == restart) ranks.insert(s.rank);
  return ranks;
}

// Ranks 0..world-1, each `times` times (once per round of that shape).
std::multiset<int> allRanks(int world, int times = 1) {
  std::multiset<int> r;
  for (int t = 0; t < times; ++t)
    for (int i = 0; i < world; ++i) r.insert(i);
  return r;
}

// How many times `needle` is in the output now (take it before a fault, then wait for more).
size_t countNow(Process& p, const std::string& needle) {
  size_t now = 0;
  p.waitForOutput([&](const std::string& out, const std::string&) {
    for (size_t at = out.find(needle); at != std::string::npos; at = out.find(needle, at + 1)) ++now;
    return true;
  }, 0ms);
  return now;
}

// Whether `pid` is a live process (not gone, not a zombie waiting to be reaped).
bool running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

// Waits until every agent's two workers of a round of `world` workers printed their lines.
void awaitRound(std::initializer_list<Process*> agents, int world) {
  for (Process* p : agents) REQUIRE(p->waitForLines("world=" + std::to_string(world), 2, kSeen));
}

// Whether `p` says `text` on stderr within `timeout`.
bool saysOnStderr(Process& p, const std::string& text, std::chrono::milliseconds timeout = kSeen) {
  return p.waitForOutput([&](const std::string&, const std::string& err) {
    return err.find(text) != std::string::npos;
  }, timeout);
}


// Where the rendezvous lives: c10d's store embedded in host 0's agent, or a 3-member etcd cluster
// on three more namespace hosts (the issue: "the fault matrix runs on both").
enum class Backend { C10d, Etcd };

// One job over a fresh cluster of `hosts` namespace hosts (agents), endpoint (store) on host 0,
// or etcd members on hosts `hosts`..`hosts`+2.
struct Matrix {
  Matrix(int hosts, const std::string& nnodes, std::string plan,
         std::vector<std::string> extra = {},
         Backend backend = Backend::C10d)
      : cluster(hosts + (backend == Backend::Etcd ? 3 : 0)), plan(std::move(plan)),
        worker(dir.write("worker.sh", kWorker).string()) {
    std::string endpoint = cluster.address(0) + ":29400";
    // etcd: a lease TTL of 3 s (a leader election, 0.5-1 s here, fits in it), as etcd_e2e_tests.
    std::string conf = "join_timeout=30,last_call_timeout=1,heartbeat_timeout=2";
    if (backend == Backend::Etcd) {
      std::string netns, addrs;
      for (int i = hosts; i < hosts + 3; ++i) {
        netns += cluster.namespaceName(i) + " ";
        addrs += cluster.address(i) + " ";
      }
      etcd = std::make_unique<EtcdCluster>(false, "MEMBER_NETNS='" + netns + "' MEMBER_ADDRS='" +
                                                      addrs + "'");
      endpoint = etcd->list();
      conf = "join_timeout=30,last_call_timeout=1,heartbeat_timeout=3";
    }
    args = {"--nnodes", nnodes, "--nproc-per-node", "2", "--rdzv-endpoint", endpoint,
            "--rdzv-id", "fm-" + randomHex(8), "--shutdown-timeout", "2", "--rdzv-conf", conf};
    if (backend == Backend::Etcd) args.insert(args.end(), {"--rdzv-backend", "etcd"});
    args.insert(args.end(), extra.begin(), extra.end());
  }

  RunOptions on(int host) const {
    std::vector<std::string> argv = {drunPath().string()};
    argv.insert(argv.end(), args.begin(), args.end());
    // Node ranks follow host names, and every namespace host has this machine's name: name each
    // by its address, so that host i is node rank i of a first round.
    argv.insert(argv.end(), {"--local-addr", cluster.address(host), "/bin/sh", worker});
    RunOptions o;
    o.argv = cluster.exec(host, argv);
    o.env = {marker.env(), "FM_DIR=" + dir.path().string(), "FM_PLAN=" + plan,
             "FM_HOST=" + std::to_string(host), "OMP_NUM_THREADS=1"};
    o.timeout = kAgentTimeout;
    return o;
  }

  // Adds key=value items to the job's --rdzv-conf.
  void conf(const std::string& more) {
    auto at = std::find(args.begin(), args.end(), "--rdzv-conf");
    REQUIRE(at != args.end());
    *(at + 1) += "," + more;
  }

  void release() { dir.write("release", ""); }

  // `ip link set eth0 up|down` inside host `host`.
  void link(int host, bool up) const {
    RunOptions o;
    o.argv = cluster.exec(host, {"/bin/sh", "-c", std::string("ip link set eth0 ") +
                                                      (up ? "up" : "down")});
    o.timeout = 10s;
    REQUIRE(run(o).status() == 0);
  }

  bool nothingLeft() const {
    auto left = marker.leftovers(10s);
    if (!left.empty()) UNSCOPED_INFO("left behind: " << MarkerScope::describe(left));
    return left.empty();
  }

  NetnsCluster cluster;
  std::unique_ptr<EtcdCluster> etcd;  // stopped before the namespaces go
  MarkerScope marker;
  TempDir dir;
  std::string plan;
  std::string worker;
  std::vector<std::string> args;
};

std::string describe(const std::vector<RunResult>& runs) {
  std::string all;
  for (size_t i = 0; i < runs.size(); ++i)
    all += "--- agent on host " + std::to_string(i) + ": " + runs[i].describe() + "\n";
  return all;
}

// A worker fails once; the job restarts on every node with TORCHELASTIC_RESTART_COUNT 1.
void failOnceAndRestart(int failingRank, Backend backend = Backend::C10d) {
  Matrix m(2, "2", std::to_string(failingRank) + ":0:exit1 *:1:done", {"--max-restarts", "1"},
           backend);
  Process a(m.on(0)), b(m.on(1));
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  const std::vector<const std::string*> outs = {&runs[0].out, &runs[1].out};
  CHECK(ranksOf(outs, 4, 0) == allRanks(4));  // round 0 ran everywhere...
  CHECK(ranksOf(outs, 4, 1) == allRanks(4));  // ...and the restart too, with one restart count
  for (const auto& r : runs) {
    CHECK_THAT(r.err, Catch::Contains("rank " + std::to_string(failingRank)) &&
                          Catch::Contains("restarting the job"));
    for (const Seen& s : seen(r.out)) CHECK(s.restart <= 1);
  }
  CHECK(m.nothingLeft());
}

void workerSigkilled(Backend backend) {
  Matrix m(2, "2", "2:0:kill *:1:done", {"--max-restarts", "1"}, backend);
  Process a(m.on(0)), b(m.on(1));
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) {
    CHECK(r.status() == 0);
    CHECK_THAT(r.err, Catch::Contains("signal SIGKILL"));
  }
  CHECK(ranksOf({&runs[0].out, &runs[1].out}, 4, 1) == allRanks(4));
  CHECK(m.nothingLeft());
}

void budgetSpent(Backend backend) {
  Matrix m(2, "2", "1:*:exit5 *:*:done", {"--max-restarts", "2"}, backend);
  Process a(m.on(0)), b(m.on(1));
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  const std::vector<const std::string*> outs = {&runs[0].out, &runs[1].out};
  for (int restart = 0; restart <= 2; ++restart) CHECK(ranksOf(outs, 4, restart).count(1) == 1);
  CHECK(ranksOf(outs, 4, 3).empty());
  for (const auto& r : runs) {
    CHECK(r.status() == 5);
    CHECK_THAT(r.err, Catch::Contains("drun: root cause: rank 1 (local_rank 1) on ") &&
                          Catch::Contains("exited with code 5"));
    CHECK_THAT(r.err, Catch::Contains("restart budget exhausted (2 restarts)"));
  }
  CHECK(m.nothingLeft());
}

void scaleUpThenAgentKilled(Backend backend) {
  Matrix m(3, "2:3", "", {}, backend);
  Process a(m.on(0)), b(m.on(1));
  REQUIRE(a.waitForLines("FM host=0", 2, kSeen));
  Process c(m.on(2));
  awaitRound({&a, &b, &c}, 6);  // the third node was taken in
  c.signal(SIGKILL);
  REQUIRE(a.waitForLines("world=4", 4, kSeen));  // a second round of 4
  REQUIRE(b.waitForLines("world=4", 4, kSeen));
  m.release();
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  // Two rounds of 4 (before the third node and after its loss), one of 6; no restart spent.
  CHECK(ranksOf({&runs[0].out, &runs[1].out}, 4, 0) == allRanks(4, 2));
  CHECK(ranksOf({&runs[0].out, &runs[1].out}, 6, 0).size() == 4);
  CHECK(c.wait().signal == SIGKILL);
  CHECK(m.nothingLeft());
}

// Host 0's workers succeed at once (it waits in the exit barrier); host 2 then arrives. Host 1
// must not stop its workers to take host 2 in: a finished node's round runs to the job's end
// (before, host 1 re-formed, waited in the next round for host 0 until the join timeout, and
// host 0 waited in the barrier for host 1).
void newcomerWhileANodeFinished(Backend backend) {
  Matrix m(3, "2:3", "0:*:done 1:*:done", {}, backend);
  const std::filesystem::path eventsOfB = m.dir.path() / "events1";
  RunOptions onB = m.on(1);
  onB.argv.insert(std::find(onB.argv.begin(), onB.argv.end(), drunPath().string()) + 1,
                  {"--events", eventsOfB.string()});
  Process a(m.on(0)), b(onB);
  REQUIRE(saysOnStderr(a, "waiting for the other 1 node(s)"));
  REQUIRE(b.waitForLines("world=4", 2, kSeen));
  Process c(m.on(2));
  REQUIRE(saysOnStderr(b, "not taking the waiting node(s) in: a node of this job already "
                          "finished; the workers go on"));
  CHECK(countNow(b, "FM host=1") == 2);  // its workers of round 0 still run, not restarted
  m.release();
  std::vector<RunResult> runs = {a.wait(), b.wait(), c.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  CHECK_THAT(runs[2].err, Catch::Contains("the job finished (every worker succeeded) while this "
                                          "node waited to join it"));
  CHECK(ranksOf({&runs[0].out, &runs[1].out, &runs[2].out}, 6, 0).empty());  // no round of 3
  // The job's events say it too, not only the console.
  const std::string events = slurp(eventsOfB);
  INFO(events);
  CHECK(contains(events, R"("event":"scale_up_refused")"));
  CHECK(contains(events, R"("reason":"a node of this job already finished")"));
  CHECK(m.nothingLeft());
}

void linkCut(Backend backend) {
  Matrix m(3, "2:3", "", {}, backend);
  Process a(m.on(0)), b(m.on(1)), c(m.on(2));
  awaitRound({&a, &b, &c}, 6);
  const size_t a4 = countNow(a, "world=4"), b4 = countNow(b, "world=4");
  const size_t a6 = countNow(a, "world=6"), c6 = countNow(c, "world=6");
  const auto cutAt = std::chrono::steady_clock::now();
  m.link(2, false);
  // The others: the cut node's lease lapses (heartbeat_timeout=2), they re-form with two.
  REQUIRE(a.waitForLines("world=4", a4 + 2, kSeen));
  REQUIRE(b.waitForLines("world=4", b4 + 2, kSeen));
  // The cut node stopped its own workers (it cannot know whether the job went on without it).
  REQUIRE(saysOnStderr(c, "lost the rendezvous store"));
  CHECK(std::chrono::steady_clock::now() - cutAt < 10s);  // within heartbeat_timeout, and then some
  m.link(2, true);
  // It reconnects and joins as a new node: the job takes it in again (6 workers).
  REQUIRE(a.waitForLines("world=6", a6 + 2, kSeen));
  REQUIRE(c.waitForLines("world=6", c6 + 2, kSeen));
  m.release();
  std::vector<RunResult> runs = {a.wait(), b.wait(), c.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  for (const auto& r : runs)
    for (const Seen& s : seen(r.out)) CHECK(s.restart == 0);  // membership changes are free
  CHECK(m.nothingLeft());
}

void spareReplacesLostMember(Backend backend) {
  Matrix m(3, "2", "", {}, backend);
  Process a(m.on(0)), b(m.on(1));
  awaitRound({&a, &b}, 4);
  Process spare(m.on(2));
  REQUIRE(saysOnStderr(spare, "waits as a spare"));
  // No churn: the running workers are untouched while the spare waits.
  CHECK_FALSE(a.waitForLines("FM host=0", 3, 1500ms));
  b.signal(SIGKILL);
  REQUIRE(a.waitForLines("FM host=0", 4, kSeen));
  REQUIRE(spare.waitForLines("world=4", 2, kSeen));
  m.release();
  std::vector<RunResult> runs = {a.wait(), spare.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  CHECK(ranksOf({&runs[0].out, &runs[1].out}, 4, 0).size() == 6);  // 2 rounds on a, 1 on spare
  CHECK(m.nothingLeft());
}

void sigtermToOneAgent(Backend backend) {
  Matrix m(3, "2:3", "", {}, backend);
  Process a(m.on(0)), b(m.on(1)), c(m.on(2));
  awaitRound({&a, &b, &c}, 6);
  const size_t a4 = countNow(a, "world=4");
  c.signal(SIGTERM);
  REQUIRE(a.waitForLines("world=4", a4 + 2, kSeen));
  m.release();
  std::vector<RunResult> runs = {a.wait(), b.wait(), c.wait()};
  INFO(describe(runs));
  CHECK(runs[0].status() == 0);
  CHECK(runs[1].status() == 0);
  CHECK(runs[2].status() == 143);
  CHECK(m.nothingLeft());
}

void replacementStartedLater(Backend backend) {
  Matrix m(3, "2", "", {}, backend);
  Process a(m.on(0)), b(m.on(1));
  awaitRound({&a, &b}, 4);
  b.signal(SIGKILL);
  REQUIRE(saysOnStderr(a, "for replacement node(s)"));
  Process c(m.on(2));  // a Kubernetes pod restart, a requeue, an operator
  REQUIRE(c.waitForLines("world=4 restart=0", 2, kSeen));
  REQUIRE(a.waitForLines("world=4 restart=0", 4, kSeen));  // its second round
  m.release();
  std::vector<RunResult> runs = {a.wait(), c.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  CHECK(b.wait().signal == SIGKILL);
  CHECK(m.nothingLeft());
}

}  // namespace

// A case that does not depend on where the store lives, as two test cases: "fault matrix: WHAT"
// on c10d and "fault matrix over etcd: WHAT".
#define ON_BOTH_BACKENDS(what, run)                                          \
  TEST_CASE("fault matrix: " what, "[multinode]") {                         \
    skipWithoutNetns("fault matrix");                                        \
    run(Backend::C10d);                                                      \
  }                                                                          \
  TEST_CASE("fault matrix over etcd: " what, "[multinode][etcd]") {         \
    skipWithoutNetns("fault matrix");                                        \
    run(Backend::Etcd);                                                      \
  }

TEST_CASE("fault matrix: a worker on the store host's node exits 1 once: every node restarts",
          "[multinode]") {
  skipWithoutNetns("fault matrix");
  failOnceAndRestart(0);  // node rank 0 hosts the store (host 0 arrives first, ranks 0-1)
}

TEST_CASE("fault matrix: a worker on another node exits 1 once: every node restarts",
          "[multinode]") {
  skipWithoutNetns("fault matrix");
  failOnceAndRestart(3);
}

TEST_CASE("fault matrix over etcd: a worker exits 1 once: every node "
          "restarts", "[multinode][etcd]") {
  skipWithoutNetns("fault matrix");
  failOnceAndRestart(3, Backend::Etcd);
}

ON_BOTH_BACKENDS("a worker SIGKILLed: the job restarts everywhere", workerSigkilled)

ON_BOTH_BACKENDS("budget spent: K+1 attempts on every node and one root cause "
                 "everywhere", budgetSpent)

TEST_CASE("fault matrix: a worker ignoring SIGTERM is SIGKILLed after the grace", "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(2, "2", "0:0:exit1 2:0:ignoreterm");
  Process a(m.on(0)), b(m.on(1));
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) {
    CHECK(r.status() == 1);
    CHECK_THAT(r.err, Catch::Contains("drun: root cause: rank 0 (local_rank 0) on "));
    CHECK(r.wall < 20s);  // grace 2 s: SIGKILL, not a hang
  }
  CHECK(m.nothingLeft());
}

ON_BOTH_BACKENDS("scale-up 2 to 3 then an agent SIGKILLed: the others go on with "
                 "2", scaleUpThenAgentKilled)

TEST_CASE("fault matrix: an agent SIGKILLed in a 2:2 job with replace_timeout=0: a clear error "
          "naming it", "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(2, "2", "");
  m.conf("replace_timeout=0");
  Process a(m.on(0)), b(m.on(1));
  awaitRound({&a, &b}, 4);
  b.signal(SIGKILL);
  RunResult r = a.wait();
  INFO(r.describe());
  CHECK(r.status() == 1);
  CHECK_THAT(r.err, Catch::Contains("the job lost node(s) ") &&
                        Catch::Contains("lost node(s) " + m.cluster.address(1)) &&
                        Catch::Contains("fewer than the minimum of 2"));
  CHECK(r.wall < 30s);
  CHECK(m.nothingLeft());
}

ON_BOTH_BACKENDS("a node arrives after another's workers succeeded: the job runs to its end "
                 "without re-forming, the newcomer learns the end", newcomerWhileANodeFinished)

ON_BOTH_BACKENDS("a link cut: the cut node fences its workers and the others re-form and it comes "
                 "back with the link", linkCut)

ON_BOTH_BACKENDS("a spare beyond MAX causes no restart and replaces a lost "
                 "member", spareReplacesLostMember)

TEST_CASE("fault matrix: the store host's node finishes first and serves until the job is done",
          "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(2, "2", "0:*:done 1:*:done");  // ranks 0-1 (the store host's node) end at once
  Process a(m.on(0)), b(m.on(1));
  REQUIRE(saysOnStderr(a, "waiting for the other 1 node(s)"));
  REQUIRE(b.waitForLines("world=4", 2, kSeen));
  CHECK(running(a.pid()));  // still there, serving the store and waiting in the barrier
  m.release();
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  CHECK(m.nothingLeft());
}

TEST_CASE("fault matrix: the store host SIGKILLed: the others fence and exit with a clear error",
          "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(2, "2", "");
  m.conf("reconnect_timeout=3");  // nobody restarts the host: the others give up after 3 s
  Process a(m.on(0)), b(m.on(1));
  awaitRound({&a, &b}, 4);
  a.signal(SIGKILL);
  RunResult r = b.wait();
  INFO(r.describe());
  CHECK(r.status() == 1);
  CHECK_THAT(r.err, Catch::Contains("lost the rendezvous store"));
  CHECK_THAT(r.err, Catch::Contains("within 3s (--rdzv-conf reconnect_timeout)"));
  CHECK(r.wall < 40s);
  CHECK(m.nothingLeft());
}

ON_BOTH_BACKENDS("SIGTERM to one agent: it leaves and the others go on without "
                 "it", sigtermToOneAgent)

TEST_CASE("fault matrix: SIGTERM to every agent: the job stops with exit 143 and nothing left",
          "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(2, "2", "");
  Process a(m.on(0)), b(m.on(1));
  awaitRound({&a, &b}, 4);
  a.signal(SIGTERM);
  b.signal(SIGTERM);
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 143);
  CHECK(m.nothingLeft());
}

TEST_CASE("fault matrix: a malformed error file: a summary on every node and no abort",
          "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(2, "2", "3:0:badfile");
  Process a(m.on(0)), b(m.on(1));
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) {
    CHECK(r.status() == 1);
    CHECK_THAT(r.err, Catch::Contains("drun: root cause: rank 3 (local_rank 1) on "));
  }
  CHECK(m.nothingLeft());
}

ON_BOTH_BACKENDS("an agent SIGKILLed in a 2:2 job: a replacement started later takes its place, "
                 "at no restart", replacementStartedLater)

TEST_CASE("fault matrix: the same --nnodes 1 command started twice with one id: the second waits "
          "and runs nothing beside the first", "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(1, "1", "");
  Process a(m.on(0));
  awaitRound({&a}, 2);
  Process twin(m.on(0));
  REQUIRE(saysOnStderr(twin, "waits as a spare"));
  CHECK_FALSE(twin.waitForLines("FM host=0", 1, 1500ms));  // no second job with rank 0
  m.release();
  std::vector<RunResult> runs = {a.wait(), twin.wait()};
  INFO(describe(runs));
  CHECK(runs[0].status() == 0);
  CHECK(runs[1].status() == 0);  // a spare ends with the job's code
  CHECK(seen(runs[1].out).empty());
  CHECK(m.nothingLeft());
}

TEST_CASE("fault matrix: the store host finishes last while its peer is paused in the exit "
          "barrier: every node exits 0", "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(2, "2", "2:*:done 3:*:done");  // node 1's ranks end at once, node 0's on release
  Process a(m.on(0)), b(m.on(1));
  REQUIRE(saysOnStderr(b, "waiting for the other 1 node(s)"));
  b.signal(SIGSTOP);  // a loaded node, a GC pause
  m.release();
  REQUIRE(a.waitForOutput([](const std::string& out, const std::string&) {
    return out.find("FM host=0") != std::string::npos;
  }, kSeen));
  // The fault itself, not a synchronisation: the peer stays paused 0.6 s (the issue's case),
  // long enough for the host's workers to end and its barrier to run without it.
  std::this_thread::sleep_for(600ms);
  b.signal(SIGCONT);
  std::vector<RunResult> runs = {a.wait(), b.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  CHECK(m.nothingLeft());
}

TEST_CASE("fault matrix: a spare paused around the job's end still ends with the job's code",
          "[multinode]") {
  skipWithoutNetns("fault matrix");
  Matrix m(3, "2", "");
  m.conf("heartbeat_timeout=5");  // the pause stays well within the spare's lease
  Process a(m.on(0)), b(m.on(1));
  awaitRound({&a, &b}, 4);
  RunOptions spareRun = m.on(2);
  spareRun.env.push_back("DRUN_LOG_LEVEL=debug");  // for its "joined round" line
  Process spare(spareRun);
  // Paused once it joined (counted in `present`): "waits as a spare" comes before its join, and a
  // spare paused in between was rightly not waited for (CI under load: the host exited at once).
  REQUIRE(saysOnStderr(spare, "waits as a spare"));
  REQUIRE(saysOnStderr(spare, "joined round"));
  spare.signal(SIGSTOP);
  m.release();
  RunResult rb = b.wait();
  CHECK(rb.status() == 0);
  CHECK(running(a.pid()));  // the store's host waits for the paused spare
  spare.signal(SIGCONT);
  std::vector<RunResult> runs = {a.wait(), spare.wait()};
  INFO(describe(runs));
  for (const auto& r : runs) CHECK(r.status() == 0);
  CHECK(m.nothingLeft());
}

// The fault matrix's harness (fault_matrix*_test.cpp): a job of real drun agents on network-
// namespace hosts, its shell worker driven by a plan, and what the workers of each round saw.
// Where the rendezvous lives: c10d's store on host 0, or a 3-member etcd cluster.
#pragma once

#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <thread>

#include "../../rendezvous/etcd/tests/etcd_cluster.hpp"
#include "drun/common/test_skip.hpp"
#include "netns.hpp"
#include "process.hpp"

namespace drun::test::fault_matrix {

using namespace std::chrono_literals;

constexpr auto kSeen = 20s;          // hang guard of "the workers of a round started"

inline const char* const kWorker = R"SH(
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
inline std::vector<Seen> seen(const std::string& out) {
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
inline std::multiset<int> ranksOf(const std::vector<const std::string*>& outs, int world, int restart) {
  std::multiset<int> ranks;
  for (const std::string* out : outs)
    for (const Seen& s : seen(*out))
      if (s.world == world && s.restart == restart) ranks.insert(s.rank);
  return ranks;
}

// Ranks 0..world-1, each `times` times (once per round of that shape).
inline std::multiset<int> allRanks(int world, int times = 1) {
  std::multiset<int> r;
  for (int t = 0; t < times; ++t)
    for (int i = 0; i < world; ++i) r.insert(i);
  return r;
}

// How many times `needle` is in the output now (take it before a fault, then wait for more).
inline size_t countNow(Process& p, const std::string& needle) {
  size_t now = 0;
  p.waitForOutput([&](const std::string& out, const std::string&) {
    for (size_t at = out.find(needle); at != std::string::npos; at = out.find(needle, at + 1)) ++now;
    return true;
  }, 0ms);
  return now;
}

// Whether `pid` is a live process (not gone, not a zombie waiting to be reaped).
inline bool running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

// Waits until every agent's two workers of a round of `world` workers printed their lines.
inline void awaitRound(std::initializer_list<Process*> agents, int world) {
  for (Process* p : agents) REQUIRE(p->waitForLines("world=" + std::to_string(world), 2, kSeen));
}

// Whether `p` says `text` on stderr within `timeout`.
inline bool saysOnStderr(Process& p, const std::string& text, std::chrono::milliseconds timeout = kSeen) {
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
  static constexpr auto kAgentTimeout = std::chrono::seconds(60);  // hang guard of one agent

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

inline std::string describe(const std::vector<RunResult>& runs) {
  std::string all;
  for (size_t i = 0; i < runs.size(); ++i)
    all += "--- agent on host " + std::to_string(i) + ": " + runs[i].describe() + "\n";
  return all;
}

}  // namespace drun::test::fault_matrix

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

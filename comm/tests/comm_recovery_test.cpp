// In-process recovery (docs/recovery.md) of libdrun_comm: ranks of comm_recovery_worker started as
// processes, a StoreServer in this process as the workers' store, and the test playing drun's
// agent (it records lost ranks, opens generations and starts replacements). Also the misuses of
// reform() and the lost ranks' records an agent may have written badly, in-process.
#include <catch2/catch.hpp>

#include <csignal>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "comm_unit_support.hpp"
#include "netns.hpp"
#include "drun/comm/communicator.hpp"
#include "drun/store/prefix_store.hpp"
#include "drun/store/store_server.hpp"
#include "drun/store/tcp_store.hpp"
#include "process.hpp"
#include "recovery.hpp"
#include "thread_checks.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

const std::string kJobPrefix = "job7/";
const char* const kRecoveryTransports[] = {"shm", "tcp"};

// The workers' store on a free loopback port, and this test's connection to it (the job's keys).
class WorkersStore {
 public:
  WorkersStore() : server_(options()) {
    server_.start();
    drun::rdzv::TcpStoreOptions o;
    o.endpoint = {"127.0.0.1", server_.port()};
    o.connectTimeout = 10s;
    o.timeout = 20s;
    store_ = std::make_shared<drun::rdzv::PrefixStore>(kJobPrefix, std::make_shared<drun::rdzv::TcpStore>(o));
  }
  ~WorkersStore() { server_.stop(); }
  drun::rdzv::LivenessStore& store() { return *store_; }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(server_.port()); }

  // The agent's move: the lost ranks' records, then compareSet(generation, g-1 -> g). The
  // steady clock's now goes to test/bumped_at_ns just before (the workers time their failure).
  // `world`: a shrink's record ("<kept ranks>\t<kept node ranks>"), written before g begins.
  void open(uint64_t g, const std::map<int, std::string>& lost = {}, const std::string& world = {}) {
    if (!world.empty()) store_->set("recovery/" + std::to_string(g) + "/world", world);
    for (const auto& [rank, record] : lost)
      store_->set("recovery/" + std::to_string(g) + "/lost/" + std::to_string(rank), record);
    store_->set("recovery/" + std::to_string(g) + "/restart_count", std::to_string(g));
    const auto now = std::chrono::steady_clock::now().time_since_epoch();
    store_->set("test/bumped_at_ns", std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()));
    const std::string previous = g == 1 ? "" : std::to_string(g - 1);
    REQUIRE(store_->compareSet("recovery/generation", previous, std::to_string(g)) == std::to_string(g));
  }

  std::optional<std::string> get(const std::string& key) { return store_->tryGet(key); }

 private:
  static drun::rdzv::StoreServerOptions options() {
    drun::rdzv::StoreServerOptions o;
    o.listen = {"127.0.0.1", 0};
    return o;
  }
  drun::rdzv::StoreServer server_;
  std::shared_ptr<drun::rdzv::LivenessStore> store_;
};

std::unique_ptr<Process> startRank(WorkersStore& ws, const MarkerScope& marker, int rank, int size,
                                   uint64_t generation, const std::string& transport,
                                   const std::vector<std::string>& args) {
  RunOptions o;
  o.argv = {helperPath("comm_recovery_worker").string()};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.env = {marker.env(), "MASTER_ADDR=127.0.0.1", "RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(size),
           "LOCAL_RANK=" + std::to_string(rank), "DRUN_WORKER_STORE=" + ws.endpoint(),
           "DRUN_WORKER_STORE_PREFIX=" + kJobPrefix, "DRUN_GENERATION=" + std::to_string(generation),
           "DRUN_RECOVERY=in-process", "DRUN_LOG_LEVEL=debug", "DRUN_COMM_TRANSPORT=" + transport, "OMP_NUM_THREADS=1"};
  o.timeout = scaled(60s);
  return std::make_unique<Process>(o);
}

std::vector<std::unique_ptr<Process>> startRanks(WorkersStore& ws, const MarkerScope& marker, int size,
                                                 const std::string& transport, const std::vector<std::string>& args) {
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(startRank(ws, marker, r, size, 0, transport, args));
  return ranks;
}

void awaitLine(Process& p, const std::string& needle) {
  INFO("waiting for '" << needle << "'");
  REQUIRE(p.waitForLines(needle, 1, scaled(30s)));
}

// Every rank ended with 0, printed "ok" and `line` (when given); returns their output.
std::string checkAllOk(std::vector<std::unique_ptr<Process>>& ranks, const std::string& line = {}) {
  std::string all;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (!ranks[r]) continue;
    RunResult res = ranks[r]->wait();
    INFO("rank " << r << ": " << res.describe());
    REQUIRE_FALSE(res.timedOut);
    CHECK(res.exitCode == 0);
    CHECK(contains(res.out, "rank " + std::to_string(r) + ": ok"));
    if (!line.empty()) CHECK(contains(res.out, line));
    all += res.out;
  }
  return all;
}

// Rank `victim` of "lost" SIGKILLed once the others' operation is pending; returns its pid.
pid_t killWhilePending(std::vector<std::unique_ptr<Process>>& ranks, int victim) {
  awaitLine(*ranks[victim], "waiting to be killed");
  for (size_t r = 0; r < ranks.size(); ++r)
    if (int(r) != victim) awaitLine(*ranks[r], "pending");
  const pid_t pid = ranks[victim]->pid();
  ranks[victim]->signal(SIGKILL);
  CHECK(ranks[victim]->wait().signal == SIGKILL);
  return pid;
}

// What the agent that opened g recorded, as drun's agent writes it.
std::string lostRecord(int rank, pid_t pid) {
  return R"({"rank":)" + std::to_string(rank) + R"(,"local_rank":)" + std::to_string(rank) +
         R"(,"node":"node0","exit_code":-9,"signal":9,"pid":)" + std::to_string(pid) + R"(,"time_ms":1})";
}

}  // namespace

TEST_CASE("comm recovery: a SIGKILLed rank is named, the survivors reform with its replacement", "[comm][recovery]") {
  for (const char* transport : kRecoveryTransports) {
    DYNAMIC_SECTION(transport) {
      const int n = 3, victim = 0;  // rank 0: the store is the workers', not rank 0's
      MarkerScope marker;
      WorkersStore ws;
      auto ranks = startRanks(ws, marker, n, transport, {"lost", std::to_string(victim)});
      const pid_t pid = killWhilePending(ranks, victim);
      ws.open(1, {{victim, lostRecord(victim, pid)}});
      ranks[victim] = startRank(ws, marker, victim, n, 1, transport, {"lost", std::to_string(victim)});
      const std::string out = checkAllOk(ranks, "generation 1");
      CHECK(contains(out, "init generation 0 (" + std::string(transport) + ")"));
      for (int r = 0; r < n; ++r)
        if (r != victim) CHECK(contains(out, "rank " + std::to_string(r) + ": reformed generation 1"));
      CHECK(contains(out, "rank " + std::to_string(victim) + ": joined generation 1"));
      CHECK(ws.get("recovery/1/outcome") == std::optional<std::string>("formed"));
      CHECK(ws.get("recovery/1/formed") == std::optional<std::string>(std::to_string(n)));
      for (int r = 0; r < n; ++r) CHECK(ws.get("recovery/1/joined/" + std::to_string(r)).has_value());
    }
  }
}

TEST_CASE("comm recovery: a shrink renumbers the survivors densely: rank() and size() follow, the new world "
          "reduces", "[comm][recovery]") {
  for (const char* transport : kRecoveryTransports) {
    DYNAMIC_SECTION(transport) {
      const int n = 4, victim = 1;
      MarkerScope marker;
      WorkersStore ws;
      auto ranks = startRanks(ws, marker, n, transport, {"lost", std::to_string(victim)});
      const pid_t pid = killWhilePending(ranks, victim);
      ranks[victim].reset();  // nobody takes its place: the world goes on without it
      ws.open(1, {{victim, lostRecord(victim, pid)}}, "0,2,3\t0");
      const std::string out = checkAllOk(ranks, "generation 1");
      CHECK(contains(out, "rank 0: reformed generation 1 as rank 0 of 3"));
      CHECK(contains(out, "rank 2: reformed generation 1 as rank 1 of 3"));
      CHECK(contains(out, "rank 3: reformed generation 1 as rank 2 of 3"));
      CHECK(ws.get("recovery/1/outcome") == std::optional<std::string>("formed"));
      CHECK(ws.get("recovery/1/formed") == std::optional<std::string>("3"));
      for (int r = 0; r < 3; ++r) CHECK(ws.get("recovery/1/joined/" + std::to_string(r)).has_value());
      CHECK_FALSE(ws.get("recovery/1/joined/3").has_value());
    }
  }
}

TEST_CASE("comm recovery: a grow aborts nothing: a receive pending across it completes, then the survivors "
          "reform into the larger world with the newcomer, ranks kept",
          "[comm][recovery]") {
  for (const char* transport : kRecoveryTransports) {
    DYNAMIC_SECTION(transport) {
      MarkerScope marker;
      WorkersStore ws;
      auto ranks = startRanks(ws, marker, 2, transport, {"grow"});
      for (auto& r : ranks) awaitLine(*r, "pending");
      ws.open(1, {}, "0,1\t0\t1\t1");  // ranks 0, 1 kept; one rank on one node added
      ws.store().set("test/send", "1");
      ranks.push_back(startRank(ws, marker, 2, 3, 1, transport, {"grow"}));
      const std::string out = checkAllOk(ranks, "generation 1");
      CHECK(contains(out, "rank 0: received 42 across the grow"));
      CHECK(contains(out, "rank 0: reformed generation 1 as rank 0 of 3"));
      CHECK(contains(out, "rank 1: reformed generation 1 as rank 1 of 3"));
      CHECK(contains(out, "rank 2: joined generation 1 as rank 2 of 3"));
      CHECK(ws.get("recovery/1/outcome") == std::optional<std::string>("formed"));
      CHECK(ws.get("recovery/1/formed") == std::optional<std::string>("3"));
    }
  }
}

TEST_CASE("comm recovery: a world record that is not what drun writes fails reform() clearly",
          "[comm][recovery]") {
  using drun::comm::detail::parseWorldRecord;
  for (const char* bad : {"0,1", "0,0\t0", "0,-1\t0", "\t0", "0,1\t0\t1", "0,1\t0\t0\t1", "0,1\t0\t1\t0",
                          "0,1\t0\tx\t1", "0,1\t0\t1\t1\t1"}) {
    INFO("'" << bad << "'");
    CHECK_THROWS_WITH(parseWorldRecord(bad), Catch::Contains("not what drun writes"));
  }
  CHECK(parseWorldRecord("2,0\t1").kept == std::vector<int>{2, 0});
  CHECK(parseWorldRecord("2,0\t1").added == 0);
  const auto grown = parseWorldRecord("0,1,2,3\t0,1\t2\t1");
  CHECK(grown.kept == std::vector<int>{0, 1, 2, 3});
  CHECK(grown.added == 2);
}

TEST_CASE("comm recovery: a new generation fails pending operations at once, every rank reforms", "[comm][recovery]") {
  for (const char* transport : kRecoveryTransports) {
    DYNAMIC_SECTION(transport) {
      const int n = 3;
      MarkerScope marker;
      WorkersStore ws;
      auto ranks = startRanks(ws, marker, n, transport, {"bump"});
      for (auto& r : ranks) awaitLine(*r, "pending");
      // Nobody died; the records are an agent's that wrote them badly: named unreadable, no crash.
      ws.open(1, {{1, "{not json"}, {2, R"({"node": 5, "pid": [1], "signal": "nine"})"}});
      const std::string out = checkAllOk(ranks, "generation 1");
      CHECK(contains(out, "rank 1 (its record is not readable)"));
      CHECK(contains(out, "rank 2 (5, killed by signal nine) were lost"));
      const std::regex after(R"(rank (\d): failed ([0-9.]+) ms after the bump)");
      int measured = 0;
      for (auto it = std::sregex_iterator(out.begin(), out.end(), after); it != std::sregex_iterator(); ++it) {
        const double ms = std::stod((*it)[2]);
        std::cout << "comm recovery (" << transport << "): rank " << (*it)[1] << "'s pending operation failed "
                  << ms << " ms after the generation changed\n";
        CHECK(ms >= 0);
        CHECK(ms < 2000 * timeScale());
        ++measured;
      }
      CHECK(measured == n);
      CHECK(ws.get("recovery/1/outcome") == std::optional<std::string>("formed"));
    }
  }
}

TEST_CASE("comm recovery: a generation that begins while one forms supersedes it", "[comm][recovery]") {
  for (const char* transport : kRecoveryTransports) {
    DYNAMIC_SECTION(transport) {
      const int n = 3, late = 2;
      MarkerScope marker;
      WorkersStore ws;
      auto ranks = startRanks(ws, marker, n, transport, {"bump", std::to_string(late)});
      for (auto& r : ranks) awaitLine(*r, "pending");
      ws.open(1);
      for (auto& r : ranks) awaitLine(*r, "failed");
      // Ranks 0 and 1 are forming generation 1 (rank 2 waits for 2): open 2 now.
      ws.store().wait({"recovery/1/joined/0", "recovery/1/joined/1"}, scaled(20s));
      ws.open(2);
      const std::string out = checkAllOk(ranks, "reformed generation 2");
      CHECK_FALSE(contains(out, "reformed generation 1"));
      CHECK(ws.get("recovery/2/outcome") == std::optional<std::string>("formed"));
      CHECK_FALSE(ws.get("recovery/1/outcome").has_value());
    }
  }
}

TEST_CASE("comm recovery: 100 reforms in a row leave fds, threads, segments and RSS flat", "[comm][recovery][slow]") {
  for (const char* transport : kRecoveryTransports) {
    DYNAMIC_SECTION(transport) {
      MarkerScope marker;
      WorkersStore ws;
      auto ranks = startRanks(ws, marker, 2, transport, {"loop", "100"});
      const std::string out = checkAllOk(ranks, "generation 100");
      std::cout << out;
      CHECK(contains(out, std::string(transport) + " after 100 reforms"));
    }
  }
}

// Hierarchical: 2 namespace hosts x 2 ranks, the workers' store a drun-rendezvous on host 0 (this
// process cannot reach the hosts' network), rank 0 opening each generation (loop mode).
TEST_CASE("comm recovery: hierarchical: two hosts reform in place 20 times, resources flat", "[comm][recovery][multinode][slow]") {
  skipWithoutNetns("hierarchical recovery");
  NetnsCluster cluster(2);
  MarkerScope marker;
  const std::string store = cluster.address(0) + ":29400";
  Process daemon(RunOptions{cluster.exec(0, {(buildDir() / "bin" / "drun-rendezvous").string(), "--host", "0.0.0.0",
                                             "--port", "29400"}),
                            {marker.env()}, {}, scaled(120s)});
  REQUIRE(daemon.waitForOutput([](const std::string& out, const std::string&) { return contains(out, "listening on"); },
                               scaled(10s)));
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < 4; ++r) {
    RunOptions o;
    o.argv = cluster.exec(r / 2, {helperPath("comm_recovery_worker").string(), "loop", "20"});
    o.env = {marker.env(), "MASTER_ADDR=" + cluster.address(0), "RANK=" + std::to_string(r), "WORLD_SIZE=4",
             "LOCAL_RANK=" + std::to_string(r % 2), "DRUN_WORKER_STORE=" + store, "DRUN_WORKER_STORE_PREFIX=" + kJobPrefix,
             "DRUN_GENERATION=0", "DRUN_RECOVERY=in-process", "DRUN_COMM_TRANSPORT=auto", "OMP_NUM_THREADS=1"};
    o.timeout = scaled(90s);
    ranks.push_back(std::make_unique<Process>(o));
  }
  const std::string out = checkAllOk(ranks, "generation 20");
  std::cout << out;
  CHECK(contains(out, "hierarchical after 20 reforms"));
}

TEST_CASE("comm recovery: reform() refuses a group and a world without the workers' store", "[comm][recovery]") {
  using namespace drun::comm;
  runRanks(2, [](int, Communicator& world) {
    T_CHECK(world.generation() == 0);
    T_CHECK_THROWS_WITH(world.reform(), Catch::Contains("no workers' store") && Catch::Contains("DRUN_WORKER_STORE"));
    auto group = world.newGroup({0, 1});
    T_CHECK_THROWS_WITH(group->reform(), Catch::Contains("is a group"));
    T_CHECK_THROWS_AS(group->reform(), drun::InvalidArgument);
    int64_t x = 1;
    world.allReduce(&x, 1, DType::Int64, ReduceOp::Sum);  // still usable
    T_CHECK(x == 2);
  });
}

TEST_CASE("comm recovery: a lost rank's record is described, or said unreadable", "[comm][recovery]") {
  using drun::comm::detail::Recovery;
  CHECK(Recovery::describeLostRank(2, lostRecord(2, 77)) == "rank 2 (node0 pid 77, killed by signal 9)");
  CHECK(Recovery::describeLostRank(1, R"({"node":"n1","pid":5,"exit_code":3,"signal":0})") ==
        "rank 1 (n1 pid 5, exit code 3)");
  CHECK(Recovery::describeLostRank(1, "") == "rank 1 (its record is not readable)");
  CHECK(Recovery::describeLostRank(1, "[1,2]") == "rank 1 (its record is not readable)");
  CHECK(Recovery::describeLostRank(1, R"({"node":"a\u001b[2Jb"})") == "rank 1 (a?[2Jb)");  // an escape
  CHECK(Recovery::describeLostRank(1, R"({"node": {"x":1}, "pid": 1.5})") == "rank 1");
  CHECK_THROWS_AS(drun::comm::detail::parseGeneration("3x"), drun::ProtocolError);
  CHECK(drun::comm::detail::parseGeneration("12") == 12);
}

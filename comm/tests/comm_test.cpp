// Multi-process tests: comm_worker and the examples as users run them, under build/bin/drun, on
// each transport (shared memory, TCP; hierarchical over two namespace hosts), and peers SIGKILLed
// mid-collective (ranks started directly, so that no agent stops the survivors).
#include <catch2/catch.hpp>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>

#include "drun/common/test_skip.hpp"
#include "drun/rendezvous/port_reservation.hpp"
#include "netns.hpp"
#include "process.hpp"
#include "comm_jobs.hpp"

using namespace drun::test;

// Sanitized builds (-O0 + ASan) run the two-host matrix many times slower: its quick form there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

namespace {

// Every transport a one-host job can use: "shm" (what auto picks there) and "tcp" (Gloo).
const char* const kTransports[] = {"shm", "tcp"};

RunResult drunRun(int nproc, const std::string& program, std::vector<std::string> args,
                  std::chrono::milliseconds timeout, const MarkerScope& marker,
                  const std::string& transport = "auto") {
  std::vector<std::string> argv = {"--standalone", "--nproc-per-node", std::to_string(nproc), program};
  for (auto& a : args) argv.push_back(std::move(a));
  return run(drunCommand(argv, {marker.env(), "OMP_NUM_THREADS=1", "DRUN_COMM_TRANSPORT=" + transport}, timeout));
}

void requireAllRanks(const RunResult& r, int n, const std::string& needle) {
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.exitCode == 0);
  for (const auto& line : parseConsole(r.out)) INFO(line.text);
  for (int k = 0; k < n; ++k)
    CHECK(r.out.find("rank " + std::to_string(k) + needle) != std::string::npos);
}

// What a job could leave in /dev/shm: entries naming drun (the segment is a memfd: none ever).
std::set<std::string> drunShmEntries() {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    if (e.path().filename().string().find("drun") != std::string::npos) names.insert(e.path().filename().string());
  return names;
}

// n ranks of comm_worker started directly (no agent to stop the survivors).
std::vector<std::unique_ptr<Process>> startRanks(int n, std::vector<std::string> args, const MarkerScope& marker,
                                                 const std::string& transport) {
  auto port = drun::rdzv::PortReservation::reserve("127.0.0.1");
  const uint16_t masterPort = port.port();
  port.release();  // rank 0's store binds it, as a worker's server binds MASTER_PORT
  std::vector<std::unique_ptr<Process>> ranks;
  for (int r = 0; r < n; ++r) {
    RunOptions o;
    o.argv = {helperPath("comm_worker").string()};
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    o.env = {marker.env(), "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(masterPort),
             "RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(n), "LOCAL_RANK=0",
             "DRUN_COMM_TRANSPORT=" + transport};
    o.timeout = 30s;
    ranks.push_back(std::make_unique<Process>(o));
  }
  return ranks;
}

}  // namespace

// Shared memory (auto's choice on one host): worlds 1..7, 1..3 with the whole matrix (1 MiB+ for
// every reduce op), 4..7 (oversubscribed on two cores) with 64 KiB+ for the non-sum ops. Gloo's
// TCP transport: worlds 2 and 4. Then groups of each world (runGroups).
TEST_CASE("comm: every op, dtype, reduce op and size matches the local reference", "[comm][slow]") {
  for (const char* transport : kTransports) {
    for (int n = 1; n <= 7; ++n) {
      if (std::string(transport) == "tcp" && n != 2 && n != 4) continue;
      DYNAMIC_SECTION(transport << " world " << n) {
        MarkerScope marker;
        std::vector<std::string> args = {"matrix"};
        if (n >= 4) args.push_back("--quick");
        auto r = drunRun(n, helperPath("comm_worker").string(), args, 90s, marker, transport);
        requireAllRanks(r, n, ": ok");
        requireAllRanks(r, n, std::string(": transport ") + (n == 1 && std::string(transport) == "tcp" ? "tcp" : transport));
      }
    }
  }
}

TEST_CASE("comm: a peer SIGKILLed mid-collective fails every survivor with its name, in time", "[comm][slow]") {
  const auto before = drunShmEntries();
  for (const char* transport : kTransports) {
    for (int n : {2, 4}) {
      for (int victim : {0, n - 1}) {  // rank 0 also hosts the store (and creates the segment)
        DYNAMIC_SECTION(transport << " world " << n << " victim " << victim) {
          MarkerScope marker;
          auto ranks = startRanks(n, {"victim", std::to_string(victim)}, marker, transport);
          checkVictimJob(ranks, victim, {"NAMED after", "pending receive NAMED"});
        }
      }
    }
  }
  CHECK(drunShmEntries() == before);
}

// Queued broadcasts: the root runs up to 32 small broadcasts ahead of its readers and returns
// without waiting. A reader killed mid-stream: the root fails when its queue is full (it waits for
// the dead reader), the other reader when the root aborts; the root killed: the readers wait for it.
TEST_CASE("comm: a rank SIGKILLed mid-stream of queued broadcasts fails every survivor with its name, in time", "[comm]") {
  for (int victim : {0, 2}) {
    DYNAMIC_SECTION("shm world 3 victim " << victim) {
      MarkerScope marker;
      auto ranks = startRanks(3, {"bcast_victim", std::to_string(victim)}, marker, "shm");
      checkVictimJob(ranks, victim, {"NAMED after"});
    }
  }
}

TEST_CASE("comm: a collective's timeout names the rank that never entered it", "[comm]") {
  for (const char* transport : kTransports) {
    DYNAMIC_SECTION(transport) {
      MarkerScope marker;
      const int n = 3, absent = 1;
      auto ranks = startRanks(n, {"absent", std::to_string(absent)}, marker, transport);
      for (int r = 0; r < n; ++r) {
        RunResult res = ranks[r]->wait();
        INFO("rank " << r << ": " << res.describe());
        REQUIRE_FALSE(res.timedOut);
        CHECK(res.exitCode == 0);
        if (r == absent) {
          CHECK(res.out.find("stayed away") != std::string::npos);
          continue;
        }
        CHECK(res.out.find("TIMEOUT") != std::string::npos);
        CHECK(res.out.find("rank 1 never entered all_reduce #3 of world") != std::string::npos);
        // The rank that did enter is not named absent.
        const int other = r == 0 ? 2 : 0;
        CHECK(res.out.find("ranks " + std::to_string(other)) == std::string::npos);
      }
    }
  }
}

TEST_CASE("comm: every rank SIGKILLed mid-collective leaves nothing in /dev/shm", "[comm][slow]") {
  const auto before = drunShmEntries();
  MarkerScope marker;
  auto ranks = startRanks(3, {"loop"}, marker, "shm");
  for (auto& p : ranks) REQUIRE(p->waitForLines("looping (shm)", 1, 20s));
  // The segment is there, mapped by every rank, and has no name anywhere.
  for (auto& p : ranks) {
    std::ifstream maps("/proc/" + std::to_string(p->pid()) + "/maps");
    std::string text((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
    CHECK(text.find("/memfd:drun-comm") != std::string::npos);
  }
  for (auto& p : ranks) p->signal(SIGKILL);
  for (auto& p : ranks) CHECK(p->wait().signal == SIGKILL);
  CHECK(drunShmEntries() == before);
}

// Two "hosts" (network namespaces) x 2 (the whole matrix: 1 MiB+ all_reduces take the split
// path) and x 3 (quick) ranks: all_reduce, broadcast, all_gather, barrier and reduce (root 2n-1:
// not a leader) hierarchical (shared memory within a host, Gloo among the leaders), the rest over
// Gloo; groups mixing ranks of one host and of both.
TEST_CASE("comm: two hosts: hierarchical collectives and mixed groups match the reference", "[comm][slow][multinode]") {
  if (auto why = NetnsCluster::unavailableReason()) skipTest("hierarchical comm test: " + *why);
  for (int perHost : {2, 3}) {
    DYNAMIC_SECTION(perHost << " ranks per host") {
      NetnsCluster cluster(2);
      MarkerScope marker;
      const std::string out = runTwoHostJob(cluster, marker, perHost,
                                            {helperPath("comm_worker").string(), "matrix",
                                             perHost == 2 && !kSanitized ? "" : "--quick"},
                                            kSanitized ? 240s : 90s);
      INFO(out);
      for (int k = 0; k < 2 * perHost; ++k) {
        CHECK(out.find("rank " + std::to_string(k) + ": ok") != std::string::npos);
        CHECK(out.find("rank " + std::to_string(k) + ": transport hierarchical") != std::string::npos);
      }
      const int last = 2 * perHost - 1;
      CHECK(out.find("rank 0: group {0," + std::to_string(last) + "} transport tcp") != std::string::npos);
      CHECK(out.find("rank " + std::to_string(last) + ": group {" + std::to_string(last - 1) + "," +
                     std::to_string(last) + "} transport shm") != std::string::npos);
      CHECK(out.find("rank 0: group {0,1,") != std::string::npos);
      CHECK(out.find("} transport hierarchical") != std::string::npos);
      // Rank 0, the second host's ranks, the rest of the first: each host's ranks are not
      // consecutive in the group.
      std::string mixed = "0";
      for (int r = perHost; r < 2 * perHost; ++r) mixed += "," + std::to_string(r);
      for (int r = 1; r < perHost; ++r) mixed += "," + std::to_string(r);
      for (int k : {0, last})
        CHECK(out.find("rank " + std::to_string(k) + ": group {" + mixed + "} transport hierarchical") != std::string::npos);
    }
  }
}

// ---- the examples (build/bin), as a user runs them ----

namespace {
// Each example runs on every transport; the callers check every run.
std::vector<RunResult> runExample(int nproc, const std::string& name, std::vector<std::string> args = {}) {
  std::vector<RunResult> runs;
  for (const char* transport : kTransports) {
    MarkerScope marker;
    auto r = drunRun(nproc, (buildDir() / "bin" / name).string(), args, 60s, marker, transport);
    INFO(transport << ": " << r.describe());
    REQUIRE_FALSE(r.timedOut);
    REQUIRE(r.exitCode == 0);
    runs.push_back(std::move(r));
  }
  return runs;
}
std::vector<std::string> linesOf(const RunResult& r) {
  std::vector<std::string> out;
  for (const auto& l : parseConsole(r.out)) out.push_back(l.text);
  return out;
}
bool hasLine(const RunResult& r, const std::string& text) {
  for (const auto& l : linesOf(r))
    if (l == text) return true;
  return false;
}
}  // namespace

TEST_CASE("comm: example hello: rank and world size from the environment", "[comm][example]") {
  for (const auto& r : runExample(3, "hello")) {
    for (int k = 0; k < 3; ++k) CHECK(hasLine(r, "Hello from rank " + std::to_string(k) + " of 3"));
  }
}

TEST_CASE("comm: example send_recv and isend_irecv: rank 1 gets rank 0's tensor", "[comm][example]") {
  for (const char* name : {"send_recv", "isend_irecv"}) {
    for (const auto& r : runExample(2, name)) {
      INFO(r.out);
      CHECK(hasLine(r, "Rank 0 has data 1.0"));
      CHECK(hasLine(r, "Rank 1 has data 1.0"));
    }
  }
}

TEST_CASE("comm: example group_all_reduce: only the group's members sum", "[comm][example]") {
  for (const auto& r : runExample(4, "group_all_reduce")) {
    INFO(r.out);
    CHECK(hasLine(r, "Rank 0 has data 2.0"));
    CHECK(hasLine(r, "Rank 1 has data 2.0"));
    CHECK(hasLine(r, "Rank 2 has data 1.0"));
    CHECK(hasLine(r, "Rank 3 has data 1.0"));
  }
}

TEST_CASE("comm: example all_gather: every rank gets every rank's value in order", "[comm][example]") {
  for (const auto& r : runExample(4, "all_gather")) {
    for (int k = 0; k < 4; ++k) CHECK(hasLine(r, "Rank " + std::to_string(k) + " gathered: 0 1 2 3"));
  }
}

TEST_CASE("comm: example synchronizing: with --barrier no rank ends a task before the slowest did it", "[comm][example]") {
  // Rank k's task takes 50*(k+1) ms; the barrier holds everyone until rank 2 (150 ms) arrives.
  for (const auto& r : runExample(3, "synchronizing", {"--barrier"})) {
    double slowestStart[2] = {0, 0}, firstEnd[2] = {1e300, 1e300};
    int lines = 0;
    for (const auto& l : linesOf(r)) {
      int task = 0, rank = 0, size = 0;
      double at = 0;
      char what[8] = {};
      if (std::sscanf(l.c_str(), "Task %d %7s on rank %d/%d at %lf", &task, what, &rank, &size, &at) != 5 ||
          task < 0 || task > 1)
        continue;
      ++lines;
      if (std::string(what) == "starts" && rank == 2) slowestStart[task] = at;
      if (std::string(what) == "ends") firstEnd[task] = std::min(firstEnd[task], at);
    }
    INFO(r.out);
    CHECK(lines == 12);
    for (int task = 0; task < 2; ++task) CHECK(firstEnd[task] >= slowestStart[task] + 145);
  }
}

TEST_CASE("comm: example sgd: the loss falls and every rank ends with the same weights", "[comm][example]") {
  for (const auto& r : runExample(3, "sgd")) {
    std::vector<std::string> weights;
    for (const auto& l : linesOf(r)) {
      double first = 0, last = 0;
      int rank = 0, used = 0;
      if (std::sscanf(l.c_str(), "rank %d: loss %lf -> %lf, weights%n", &rank, &first, &last, &used) == 3) {
        CHECK(last < first / 10);
        weights.push_back(l.substr(static_cast<size_t>(used)));
      }
    }
    INFO(r.out);
    REQUIRE(weights.size() == 3);
    CHECK(weights[0] == weights[1]);
    CHECK(weights[1] == weights[2]);
  }
}

TEST_CASE("comm: example hello_c: the C API reduces and reports misuse as a status", "[comm][example]") {
  for (const auto& r : runExample(3, "hello_c")) {
    for (int k = 0; k < 3; ++k) CHECK(hasLine(r, "rank " + std::to_string(k) + " of 3: sum 6 (correct)"));
    CHECK(r.out.find("status 1: send: rank 8 is not a rank of world") != std::string::npos);
  }
}

TEST_CASE("comm: an installed drun serves find_package(drun) and drun::comm to a user's project", "[comm][slow][install]") {
  TempDir dir;
  const std::string prefix = (dir / "prefix").string(), userBuild = (dir / "build").string();
  const std::string source = DRUN_COMM_SOURCE_DIR "/tests/user_project";
  auto step = [](std::vector<std::string> argv) {
    RunOptions o;
    o.argv = std::move(argv);
    o.timeout = 120s;
    auto r = run(o);
    INFO(r.describe());
    REQUIRE(r.exitCode == 0);
  };
  step({"/usr/bin/cmake", "--install", buildDir().string(), "--prefix", prefix});
  step({"/usr/bin/cmake", "-S", source, "-B", userBuild, "-G", "Ninja", "-DCMAKE_PREFIX_PATH=" + prefix});
  step({"/usr/bin/cmake", "--build", userBuild});
  MarkerScope marker;
  auto cpp = drunRun(2, userBuild + "/user_cpp", {}, 60s, marker);
  INFO(cpp.describe());
  CHECK(cpp.exitCode == 0);
  CHECK(cpp.out.find("user_cpp rank 1: 2") != std::string::npos);
  CHECK(cpp.out.find("rank 0: caught InvalidArgument") != std::string::npos);
  auto c = drunRun(2, userBuild + "/user_c", {}, 60s, marker);
  INFO(c.describe());
  CHECK(c.out.find("user_c rank 0: 2") != std::string::npos);
}

TEST_CASE("comm: the bootstrap store requires and proves the job's token", "[comm]") {
  TempDir dir;
  const auto token = dir.write("token", "comm-token-0123456789abcdef");
  MarkerScope marker;
  // The agent hands the workers DRUN_RDZV_TOKEN_FILE (store_access_e2e_test checks the
  // variable); rank 0's store then requires the token and every rank proves it.
  std::vector<std::string> argv = {"--standalone", "--nproc-per-node", "2", "--rdzv-conf",
                                   "token_file=" + token.string(),
                                   helperPath("comm_worker").string(), "matrix", "--quick"};
  auto withToken = run(drunCommand(argv, {marker.env(), "OMP_NUM_THREADS=1"}, 90s));
  requireAllRanks(withToken, 2, ": ok");
}

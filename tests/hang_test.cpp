// End-to-end tests of hang detection (docs/hangs.md): drun run as a user runs it, with a rank
// that hangs in one way or another; each asserts that the summary names the hung rank, says
// "hung" and shows a stack excerpt, on every node. Small hang timeouts (1 s) keep them fast;
// the deadlines are generous upper bounds, never synchronisation.
#include <catch2/catch.hpp>
#include <regex>

#include "drun/common/test_skip.hpp"
#include "netns.hpp"
#include "process.hpp"
#include "torch_python.hpp"

namespace fs = std::filesystem;
using namespace drun::test;
using namespace std::chrono_literals;

namespace {

std::string hangWorker() { return helperPath("hang_worker").string(); }
fs::path pythonPackage() { return buildDir() / "lib" / "drun" / "python"; }

RunResult runDrun(const MarkerScope& marker, std::vector<std::string> args,
               std::vector<std::string> env = {}, std::chrono::milliseconds timeout = 30s) {
  RunOptions o;
  o.argv = {drunPath().string(), "--standalone"};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.env = std::move(env);
  o.env.push_back(marker.env());
  o.env.push_back("OMP_NUM_THREADS=1");
  o.timeout = timeout;
  return run(o);
}

// A run outside drun: exit 0, `says` on stdout.
void checkRanAlone(const RunResult& r, const std::string& says) {
  INFO(r.describe());
  CHECK(r.status() == 0);
  CHECK(contains(r.out, says));
}

void checkNothingLeft(const MarkerScope& marker) {
  auto left = marker.leftovers(5s);
  INFO(MarkerScope::describe(left));
  CHECK(left.empty());
}

// A Python training loop: `steps` steps in section "step", then rank HANG_RANK runs
// spin_forever() (only in attempt HANG_RESTART when given).
constexpr const char* kPythonLoop = R"(import os, time
import drun.worker
rank = int(os.environ["RANK"])
def spin_forever():
    while True:
        pass
for _ in range(5):
    with drun.worker.section("step"):
        time.sleep(0.02)
    drun.worker.heartbeat()
if rank == int(os.environ.get("HANG_RANK", "1")) and os.environ.get("HANG_RESTART", os.environ["TORCHELASTIC_RESTART_COUNT"]) == os.environ["TORCHELASTIC_RESTART_COUNT"]:
    spin_forever()
print("rank", rank, "done", flush=True)
)";

// Rank 1 outlives its torch timer (expires(after=1), scope "load_batch") in time.sleep, line 7.
constexpr const char* kTorchTimerProgram = R"(import os, time
from torch.distributed.elastic import timer
timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
rank = int(os.environ["RANK"])
with timer.expires(after=1, scope="load_batch"):
    if rank == 1:
        time.sleep(1000)
print("rank", rank, "done", flush=True)
)";

}  // namespace

TEST_CASE("hang: a native rank stuck in a system call is named with its eu-stack excerpt", "[hangs]") {
  MarkerScope marker;
  RunResult r = runDrun(marker, {"--nproc-per-node", "2", "--hang-timeout", "1", hangWorker(),
                              "--hang", "sleep", "--hang-rank", "1"});
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() == 128 + 9);  // the hung rank was SIGKILLed after its stack was taken
  CHECK(contains(r.err, "drun: root cause: rank 1 (local_rank 1) on "));
  CHECK(std::regex_search(r.err, std::regex(R"(hung: no heartbeat for [0-9.]+s \(hang timeout 1\.0s\))")));
  CHECK(contains(r.err, "stuckInSleep"));  // the frame it is stuck in, from eu-stack (or gdb)
  CHECK(r.wall < 15s);
  checkNothingLeft(marker);
}

TEST_CASE("hang: a Python rank in an infinite loop is named with its faulthandler traceback", "[hangs]") {
  MarkerScope marker;
  TempDir dir;
  RunResult r = runDrun(marker, {"--nproc-per-node", "2", "--hang-timeout", "1",
                              dir.write("train.py", kPythonLoop).string()});
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() == 128 + 6);  // SIGABRT: faulthandler dumped the stack and re-raised
  CHECK(contains(r.err, "drun: root cause: rank 1 (local_rank 1) on "));
  CHECK(contains(r.err, "hung: no heartbeat for "));
  CHECK(contains(r.err, "its Python stack (faulthandler"));
  CHECK(std::regex_search(r.err, std::regex(R"(drun: +File ".*train\.py", line [0-9]+ in spin_forever)")));
  checkNothingLeft(marker);
}

TEST_CASE("hang: a section past its timeout is a hang while heartbeats go on", "[hangs]") {
  MarkerScope marker;
  RunResult r = runDrun(marker, {"--nproc-per-node", "2", "--hang-timeout", "30,ckpt=1", hangWorker(),
                              "--hang", "section", "--section", "ckpt", "--hang-rank", "0"});
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() != 0);
  CHECK(contains(r.err, "drun: root cause: rank 0 (local_rank 0) on "));
  CHECK(std::regex_search(r.err, std::regex(R"(hung: in section "ckpt" for [0-9.]+s \(its timeout 1\.0s\), last heartbeat [0-9.]+m?s ago)")));
  CHECK(contains(r.err, "its stack ("));
  CHECK(r.wall < 25s);  // the section's 1 s, not the 30 s silence timeout
  checkNothingLeft(marker);
}

TEST_CASE("hang: heartbeats work across a restart, the budget and the summary apply", "[hangs]") {
  MarkerScope marker;
  TempDir dir;
  // Rank 1 hangs in every attempt: detected in both, then the budget (1 restart) is spent.
  RunResult r = runDrun(marker, {"--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout", "1",
                              dir.write("train.py", kPythonLoop).string()});
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() == 128 + 6);
  std::regex hung(R"(drun: rank 1 \(local_rank 1\) on \S+ hung: no heartbeat)");
  CHECK(std::distance(std::sregex_iterator(r.err.begin(), r.err.end(), hung), std::sregex_iterator()) == 2);
  CHECK(contains(r.err, "restarting the job (restart 1 of 1)"));
  CHECK(contains(r.err, "restart budget exhausted"));
  CHECK(contains(r.err, "drun: root cause: rank 1 (local_rank 1)"));
}

TEST_CASE("hang: after a hang in the first attempt the restarted job succeeds", "[hangs]") {
  MarkerScope marker;
  TempDir dir;
  RunResult r = runDrun(marker, {"--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout", "1",
                              dir.write("train.py", kPythonLoop).string()},
                     {"HANG_RESTART=0"});
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() == 0);
  CHECK(contains(r.err, "hung: no heartbeat"));
  CHECK(contains(r.out, "rank 1 done"));
}

TEST_CASE("hang: learned timeouts (auto) with jittery steps: no false positive, then a hang caught", "[hangs]") {
  MarkerScope marker;
  TempDir dir;
  // 60 steps of 10..90 ms (jitter), then rank 1 stops beating inside a step.
  const char* program = R"(import os, random, time
import drun.worker
rank = int(os.environ["RANK"])
random.seed(rank)
for i in range(60):
    with drun.worker.section("step"):
        time.sleep(random.uniform(0.01, 0.09))
        if rank == 1 and i == 59:
            print("rank 1 hangs", flush=True)
            time.sleep(1000)
print("rank", rank, "done", flush=True)
)";
  RunResult r = runDrun(marker, {"--nproc-per-node", "2", "--hang-timeout", "auto,floor=1,warmup=0",
                              dir.write("train.py", program).string()});
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(contains(r.out, "rank 0 done"));  // no false positive on the jittery rank 0
  CHECK(contains(r.out, "rank 1 hangs"));
  CHECK(std::regex_search(r.err, std::regex(R"(root cause: rank 1 \(local_rank 1\) on \S+ hung: in section "step" for [0-9.]+s \(learned timeout)")));
  CHECK(contains(r.err, "time.sleep") == false);  // a C call: faulthandler shows the Python line
  CHECK(std::regex_search(r.err, std::regex(R"(File ".*train\.py", line 10 in <module>)")));
}

TEST_CASE("hang: zero-code detection (--hang-idle) names an idle rank once another finished", "[hangs]") {
  MarkerScope marker;
  RunResult r = runDrun(marker, {"--nproc-per-node", "2", "--hang-idle", "1", "/bin/sh", "-c",
                              "[ $RANK = 1 ] && exec sleep 1000; exit 0"});
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() != 0);
  CHECK(std::regex_search(r.err, std::regex(R"(root cause: rank 1 \(local_rank 1\) on \S+ hung: no CPU time and no output for [0-9.]+s)")));
  CHECK(contains(r.err, "its stack ("));
  checkNothingLeft(marker);
}

TEST_CASE("hang: torch's FileTimer expires() under drun names the rank and the scope", "[hangs][torch]") {
  skipWithoutTorch("torch FileTimer under drun");
  MarkerScope marker;
  TempDir dir;
  RunResult r = runDrun(marker, {"--nproc-per-node", "2", dir.write("timer.py", kTorchTimerProgram).string()},
                     {std::string("PYTHON_EXEC=") + kTorchPython, "TORCHELASTIC_ENABLE_FILE_TIMER=1"}, 60s);
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(contains(r.out, "rank 0 done"));
  CHECK(contains(r.err, "drun: root cause: rank 1 (local_rank 1) on "));
  CHECK(contains(r.err, "hung: torch timer \"load_batch\" expired"));
  CHECK(std::regex_search(r.err, std::regex(R"(File ".*timer\.py", line 7 in <module>)")));
  checkNothingLeft(marker);
}

TEST_CASE("hang: the worker API is a no-op outside drun", "[hangs]") {
  RunOptions native;
  native.argv = {hangWorker(), "--steps", "3", "--step-ms", "1"};
  checkRanAlone(run(native), "channel off");
  RunOptions python;
  python.argv = {"/usr/bin/python3", "-c",
                 "import drun.worker as w\n"
                 "assert not w.enabled()\n"
                 "w.heartbeat()\n"
                 "with w.section('step'): w.heartbeat()\n"
                 "print('ok')\n"};
  python.env = {"PYTHONPATH=" + pythonPackage().string(), "DRUN_WORKER_CHANNEL"};
  checkRanAlone(run(python), "ok");
  // A channel that is not one (a missing file, a short file) leaves the API a no-op too.
  TempDir dir;
  for (const std::string& channel : {(dir / "missing").string(), dir.write("short", "x").string()}) {
    native.env = {"DRUN_WORKER_CHANNEL=" + channel};
    checkRanAlone(run(native), "channel off");
  }
}

TEST_CASE("hang: bad --hang-timeout and --hang-idle values are usage errors", "[hangs]") {
  MarkerScope marker;
  for (auto [flag, value, says] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"--hang-timeout", "soon", "--hang-timeout: expected a duration"},
           {"--hang-timeout", "0", "must be above 0"},
           {"--hang-timeout", "step=", "--hang-timeout step: expected a duration"},
           {"--hang-timeout", "5,6", "two timeouts without a section name"},
           {"--hang-timeout", "a,b=1", "--hang-timeout: expected a duration"},
           {"--hang-timeout", "step=1,step=2", "section 'step' given twice"},
           {"--hang-idle", "-1", "--hang-idle: expected a duration"}}) {
    RunResult r = runDrun(marker, {flag, value, "/bin/true"});
    INFO(flag << " " << value << "\n" << r.describe());
    CHECK(r.status() == 2);
    CHECK(contains(r.err, says));
  }
}

// One drun per namespace host (one worker each), with `program`; returns both runs.
std::vector<RunResult> runOnTwoHosts(const MarkerScope& marker, const std::vector<std::string>& program,
                                     std::vector<std::string> env = {}) {
  NetnsCluster cluster(2);
  auto on = [&](int host) {
    std::vector<std::string> argv = {drunPath().string(), "--nnodes", "2", "--nproc-per-node", "1",
                                     "--rdzv-endpoint", cluster.address(0) + ":29400", "--rdzv-id",
                                     "hang-" + std::to_string(::getpid())};
    argv.insert(argv.end(), program.begin(), program.end());
    RunOptions o;
    o.argv = cluster.exec(host, argv);
    o.env = env;
    o.env.push_back(marker.env());
    o.env.push_back("OMP_NUM_THREADS=1");
    o.timeout = 60s;
    return o;
  };
  Process host0(on(0));
  Process host1(on(1));
  return {host0.wait(), host1.wait()};
}

TEST_CASE("hang: on two namespace hosts, every node prints the hung rank and its stack", "[hangs][multinode]") {
  if (auto why = NetnsCluster::unavailableReason()) skipTest("multi-node hang test: " + *why);
  MarkerScope marker;
  for (const RunResult& r : runOnTwoHosts(marker, {"--hang-timeout", "1", hangWorker(), "--hang", "sleep", "--hang-rank", "1"})) {
    INFO(r.describe());
    REQUIRE(!r.timedOut);
    CHECK(r.status() == 128 + 9);
    CHECK(std::regex_search(r.err, std::regex(R"(drun: root cause: rank 1 \(local_rank 0\) on \S+ hung: no heartbeat for)")));
    CHECK(contains(r.err, "stuckInSleep"));
  }
  checkNothingLeft(marker);
}

TEST_CASE("hang: torch's expires() on two namespace hosts, every node names the rank and the scope", "[hangs][multinode][torch]") {
  if (auto why = NetnsCluster::unavailableReason()) skipTest("multi-node hang test: " + *why);
  skipWithoutTorch("torch FileTimer on two hosts");
  MarkerScope marker;
  TempDir dir;
  auto program = dir.write("timer.py", kTorchTimerProgram).string();
  for (const RunResult& r : runOnTwoHosts(marker, {kTorchPython, program}, {"TORCHELASTIC_ENABLE_FILE_TIMER=1"})) {
    INFO(r.describe());
    REQUIRE(!r.timedOut);
    CHECK(r.status() == 128 + 6);
    CHECK(std::regex_search(r.err, std::regex(R"(drun: root cause: rank 1 \(local_rank 0\) on \S+ hung: torch timer "load_batch" expired)")));
    CHECK(std::regex_search(r.err, std::regex(R"(File ".*timer\.py", line 7 in <module>)")));
  }
  checkNothingLeft(marker);
}

TEST_CASE("hang: learned timeouts are shared through the store: a node that learned nothing catches a hang", "[hangs][multinode]") {
  if (auto why = NetnsCluster::unavailableReason()) skipTest("multi-node hang test: " + *why);
  MarkerScope marker;
  TempDir dir;
  // Attempt 0: rank 0 (host 0) learns 20 steps, rank 1 (host 1) beats nothing and fails.
  // Attempt 1: rank 1 hangs in its 3rd step, before host 1 could have learned anything itself.
  const char* program = R"(import os, sys, time
import drun.worker
rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if restart == 0 and rank == 1:
    time.sleep(3)
    sys.exit(1)
for i in range(20 if rank == 0 else 3):
    with drun.worker.section("step"):
        time.sleep(0.02)
        if restart == 1 and rank == 1 and i == 2:
            time.sleep(1000)
)";
  auto script = dir.write("learn.py", program).string();
  for (const RunResult& r : runOnTwoHosts(marker, {"--hang-timeout", "auto,floor=1,warmup=0", "--max-restarts", "1", kTorchPython, script})) {
    INFO(r.describe());
    REQUIRE(!r.timedOut);
    CHECK(r.status() == 128 + 6);
    CHECK(std::regex_search(r.err, std::regex(R"(drun: root cause: rank 1 \(local_rank 0\) on \S+ hung: in section "step" for [0-9.]+s \(learned timeout)")));
  }
  checkNothingLeft(marker);
}

TEST_CASE("hang: the rank that never entered a collective is named, not the ranks waiting in it", "[hangs]") {
  if (!fs::exists(helperPath("hang_comm_worker"))) skipTest("hang_comm_worker is not built (no libdrun_comm)");
  MarkerScope marker;
  RunResult r = runDrun(marker, {"--nproc-per-node", "3", "--hang-timeout", "1",
                                 helperPath("hang_comm_worker").string(), "--hang-rank", "1"});
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() == 128 + 9);
  CHECK(std::regex_search(r.err, std::regex(R"(root cause: rank 1 \(local_rank 1\) on \S+ hung: no heartbeat for [0-9.]+s \(hang timeout 1\.0s\)\n)")));
  CHECK(!contains(r.err, "hung: no heartbeat for 2"));  // no waiter was named
  CHECK(contains(r.err, "main"));                        // its stack
  checkNothingLeft(marker);
}

// libdrun_comm marks a collective in the channel about once per watchdog poll (100 ms), not each
// one: 1.5 s of 1 ms steps, each ending in a small all_reduce, with no heartbeat of the
// program's own must still beat (the first collective after each poll does; a poll itself rarely
// finds one in progress), so no rank is called hung at 1 s; and the ranks then stuck in the 6th
// all_reduce must still be marked its waiters (the watchdog marks a collective it finds in progress).
TEST_CASE("hang: a loop of fast collectives beats, and the waiters of the stuck one are marked", "[hangs]") {
  if (!fs::exists(helperPath("hang_comm_worker"))) skipTest("hang_comm_worker is not built (no libdrun_comm)");
  MarkerScope marker;
  RunResult r = runDrun(marker, {"--nproc-per-node", "3", "--hang-timeout", "1", helperPath("hang_comm_worker").string(),
                                 "--loop-seconds", "1.5", "--hang-rank", "2"});
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() == 128 + 9);
  CHECK(contains(r.out, "rank 2 stops before all_reduce #6"));  // the loop ended: nobody was called hung in it
  CHECK(std::regex_search(r.err, std::regex(R"(root cause: rank 2 \(local_rank 2\) on \S+ hung: no heartbeat for [0-9.]+s \(hang timeout 1\.0s\)\n)")));
  CHECK(!contains(r.err, "hung: no heartbeat for 2"));  // no waiter was named
  checkNothingLeft(marker);
}

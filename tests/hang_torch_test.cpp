// End-to-end tests of hang detection with torch.distributed jobs (docs/hangs.md): the rank that
// is not waiting in a collective is blamed, with gloo (nothing in the channel says who waits:
// the ranks' stacks do) and with drun's backend; --hang-idle judges the rank's main thread.
// Small timeouts keep them fast; the deadlines are generous upper bounds, never synchronisation.
#include <catch2/catch.hpp>
#include <regex>

#include "process.hpp"
#include "torch_python.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

// Both ranks beat after each of 5 all_reduces; then rank 1 sleeps (line 15) while rank 0 waits
// for it in the 6th. argv[1]: the backend; argv[2] "beat": heartbeats, else none (--hang-idle).
constexpr const char* kSleeperProgram = R"(import sys, time
import torch, torch.distributed as dist
import drun.worker
if sys.argv[1] == "drun":
    import drun.torch
dist.init_process_group(sys.argv[1])
rank = dist.get_rank()
t = torch.ones(4)
for _ in range(5):
    dist.all_reduce(t)
    if sys.argv[2] == "beat":
        drun.worker.heartbeat()
print("rank", rank, "stepped", flush=True)
if rank == 1:
    time.sleep(1000)
dist.all_reduce(t)
print("rank", rank, "done", flush=True)
)";

// One drun --standalone --nproc-per-node 2 of a torch program: its marker, and a directory for the
// program and the flight records.
struct TorchJob {
  MarkerScope marker;
  TempDir dir;

  RunResult launch(std::vector<std::string> args, std::vector<std::string> env = {}) const {
    RunOptions o;
    o.argv = {drunPath().string(), "--standalone", "--nproc-per-node", "2"};
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    o.env = std::move(env);
    for (std::string e : {marker.env(), std::string("OMP_NUM_THREADS=1"), std::string("PYTHON_EXEC=") + kTorchPython})
      o.env.push_back(e);
    o.timeout = 120s;
    return run(o);
  }
  // kSleeperProgram on `backend` ("gloo", "drun"), its ranks beating ("beat") or not ("quiet"),
  // under `hangOption` 2 ("--hang-timeout", "--hang-idle").
  RunResult launchSleeper(const std::string& hangOption, const std::string& backend, const std::string& beats,
                          std::vector<std::string> env = {}) {
    return launch({hangOption, "2", dir.write("hang.py", kSleeperProgram).string(), backend, beats}, std::move(env));
  }
};

void checkRankOneBlamed(const RunResult& r, const std::string& rule, const std::string& rankZeroWaits) {
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(contains(r.out, "rank 0 stepped"));
  CHECK(std::regex_search(r.err, std::regex(R"(drun: root cause: rank 1 \(local_rank 1\) on \S+ hung: )" + rule)));
  CHECK(std::regex_search(r.err, std::regex(R"(drun:   why: rank 1 is not waiting for its peers \(its main thread is in )"
                                            R"(clock_nanosleep, Python at hang\.py:15 in <module>\); rank 0 waits in )" +
                                            rankZeroWaits + "\n")));
  // The culprit's stack is the one shown: faulthandler's, at its sleep.
  CHECK(std::regex_search(r.err, std::regex(R"(drun: +File ".*hang\.py", line 15 in <module>)")));
}

}  // namespace

TEST_CASE_METHOD(TorchJob, "hang blame: gloo, rank 1 sleeps while rank 0 waits in all_reduce: rank 1 is blamed",
                 "[hangs][torch]") {
  skipWithoutTorch("hang blame with gloo");
  RunResult r = launchSleeper("--hang-timeout", "gloo", "beat");
  checkRankOneBlamed(r, R"(no heartbeat for [0-9.]+s \(hang timeout 2\.0s\)\n)", "c10d::Work::wait");
}

// The flight records (each rank's last collectives, written on the agent's SIGUSR2) say rank 1
// never entered the 6th all_reduce, in the summary and in `drun trace`.
TEST_CASE_METHOD(TorchJob, "hang blame: drun's backend, rank 1 sleeps while rank 0 waits in all_reduce: rank 1 is blamed",
                 "[hangs][torch]") {
  skipWithoutDrunTorch("hang blame with the drun backend");
  RunResult r = launchSleeper("--hang-timeout", "drun", "beat", {"DRUN_FLIGHT_RECORD_DIR=" + dir.path().string()});
  checkRankOneBlamed(r, R"(no heartbeat for [0-9.]+s \(hang timeout 2\.0s\)\n)",
                     R"(all_reduce #[0-9]+ of \S+; flight records: rank 1 never entered all_reduce #6 of group 0-1 )"
                     R"(\(its last: all_reduce #5 of group 0-1, completed\))");

  RunOptions trace;
  trace.argv = {drunPath().string(), "trace", dir.path().string()};
  RunResult t = run(trace);
  INFO(t.describe());
  CHECK(t.status() == 0);
  CHECK(contains(t.out, "2 flight record(s)\nrank 1 never entered all_reduce #6 of group 0-1"));
}

// --hang-idle judges the main thread: rank 0's gloo and torch threads keep its process's CPU time
// moving while its main thread waits in all_reduce; both ranks are idle, and rank 1 is blamed.
TEST_CASE_METHOD(TorchJob, "hang blame: --hang-idle, gloo: the rank waiting in all_reduce is idle, the sleeper is blamed",
                 "[hangs][torch]") {
  skipWithoutTorch("--hang-idle with gloo");
  RunResult r = launchSleeper("--hang-idle", "gloo", "quiet");
  checkRankOneBlamed(r, R"(no CPU time and no output for [0-9.]+s \(--hang-idle 2\.0s\)\n)", "c10d::Work::wait");
}

// The recorder's thread belongs to the rank's process: a forked child (a DataLoader worker) that
// gets SIGUSR2 survives it, and the rank still writes its record on SIGUSR2 afterwards. (The
// child leaves with os._exit: a forked child of a drun-backend rank that runs Python's
// finalization hangs in the process group's teardown, with or without the recorder.)
TEST_CASE_METHOD(TorchJob, "flight recorder: a forked child survives SIGUSR2, and the rank still answers it",
                 "[hangs][torch]") {
  skipWithoutDrunTorch("the flight recorder and fork");
  const char* program = R"(import json, os, signal, sys, time
import torch, torch.distributed as dist
import drun.torch
dist.init_process_group("drun")
rank = dist.get_rank()
dist.all_reduce(torch.ones(4))
pid = os.fork()
if pid == 0:
    os.kill(os.getpid(), signal.SIGUSR2)
    os._exit(0)
print("rank", rank, "child status", os.waitpid(pid, 0)[1], flush=True)
record = os.path.join(os.environ["DRUN_FLIGHT_RECORD_DIR"], "flight_record_rank%d.json" % rank)
os.kill(os.getpid(), signal.SIGUSR2)
deadline = time.time() + 20
while time.time() < deadline:
    with open(record) as f:
        text = f.read()
    if '"reason": "SIGUSR2"' in text:
        print("rank", rank, "recorded", json.loads(text)["entries"][0]["op"], flush=True)
        break
    time.sleep(0.05)
dist.barrier()
)";
  RunResult r = launch({dir.write("fork.py", program).string()}, {"DRUN_FLIGHT_RECORD_DIR=" + dir.path().string()});
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() == 0);
  for (const char* rank : {"0", "1"}) {
    CHECK(contains(r.out, std::string("rank ") + rank + " child status 0"));
    CHECK(contains(r.out, std::string("rank ") + rank + " recorded all_reduce"));
  }
}

// A collective that fails (here: its timeout, rank 1 never comes) has its rank's record written,
// by the recorder's own thread, while the failure goes on to the caller.
TEST_CASE_METHOD(TorchJob, "flight recorder: a collective that times out writes its rank's record, the collective "
                 "marked failed", "[hangs][torch]") {
  skipWithoutDrunTorch("the flight recorder on a failure");
  const char* program = R"(import datetime, json, os, time
import torch, torch.distributed as dist
import drun.torch
dist.init_process_group("drun", timeout=datetime.timedelta(seconds=2))
rank = dist.get_rank()
dist.all_reduce(torch.ones(4))
if rank == 1:
    time.sleep(6)  # never enters the second all_reduce
    os._exit(0)
try:
    dist.all_reduce(torch.ones(4))
except RuntimeError:
    pass
record = os.path.join(os.environ["DRUN_FLIGHT_RECORD_DIR"], "flight_record_rank0.json")
deadline = time.time() + 20
while time.time() < deadline:
    with open(record) as f:
        text = f.read()
    if '"reason": "a collective failed"' in text:
        last = json.loads(text)["entries"][-1]
        print("recorded", last["op"], last["state"], flush=True)
        break
    time.sleep(0.05)
os._exit(0)
)";
  RunResult r = launch({dir.write("fails.py", program).string()}, {"DRUN_FLIGHT_RECORD_DIR=" + dir.path().string()});
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() == 0);
  CHECK(contains(r.out, "recorded all_reduce failed"));
}

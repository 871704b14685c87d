// End-to-end tests of --hang-timeout auto's safety (docs/hangs.md): a loop of steps that beat and
// an evaluation that does not survives; the timeout learned is said; after a hang a learned
// timeout called, the restarted job learns afresh. Deadlines are upper bounds, never
// synchronisation.
#include <catch2/catch.hpp>
#include <regex>

#include "process.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

RunResult runLearning(const MarkerScope& marker, std::vector<std::string> args) {
  RunOptions o;
  o.argv = {drunPath().string(), "--standalone", "--nproc-per-node", "2"};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.env = {marker.env()};
  o.timeout = 60s;
  return run(o);
}

// 30 steps of 50 ms that beat, a 3 s evaluation that does not (rank 1), 30 steps more.
constexpr const char* kStepThenEvaluate = R"(import os, time
import drun.worker
rank = int(os.environ["RANK"])
for epoch in range(2):
    for _ in range(30):
        time.sleep(0.05)
        drun.worker.heartbeat()
    if epoch == 0 and rank == 1:
        print("rank 1 evaluates", flush=True)
        time.sleep(3)
print("rank", rank, "done", flush=True)
)";

// Attempt 0: 20 steps, then rank 1 evaluates 3 s (learned 1 s: a hang). Attempt 1: 5 steps (no
// warm-up), then the same evaluation, which only a timeout kept from attempt 0 would call a hang.
constexpr const char* kEvaluateAfterRestart = R"(import os, time
import drun.worker
rank, restart = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
for _ in range(20 if restart == 0 else 5):
    time.sleep(0.05)
    drun.worker.heartbeat()
if rank == 1:
    time.sleep(3)
print("rank", rank, "done in attempt", restart, flush=True)
)";

}  // namespace

TEST_CASE("hang auto: a step-then-evaluate loop survives its evaluation, and what was learned is said", "[hangs]") {
  MarkerScope marker;
  TempDir dir;
  const std::string program = dir.write("train.py", kStepThenEvaluate).string();
  // Default: the warm-up (60 s) is not over; no warm-up: the floor (30 s) holds.
  for (const char* setting : {"auto", "auto,warmup=0"}) {
    RunResult r = runLearning(marker, {"--hang-timeout", setting, program});
    INFO(setting << "\n" << r.describe());
    REQUIRE(!r.timedOut);
    CHECK(r.status() == 0);
    CHECK(contains(r.out, "rank 1 evaluates"));
    CHECK(contains(r.out, "rank 1 done"));
  }
  RunResult r = runLearning(marker, {"--hang-timeout", "auto,warmup=0", program});
  INFO(r.describe());
  CHECK(std::regex_search(r.err, std::regex(R"(drun: hang timeout learned for heartbeats: 30\.0s \(the floor; the longest interval seen [0-9]+ms\)\n)")));
}

TEST_CASE("hang auto: after a hang a learned timeout called, the restarted job learns afresh", "[hangs]") {
  MarkerScope marker;
  TempDir dir;
  RunResult r = runLearning(marker, {"--hang-timeout", "auto,floor=1,warmup=0", "--max-restarts", "1",
                                     dir.write("train.py", kEvaluateAfterRestart).string()});
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(std::regex_search(r.err, std::regex(R"(drun: rank 1 \(local_rank 1\) on \S+ failed \(hung: no heartbeat for [0-9.]+s \(learned timeout 1\.0s\)\); restarting)")));
  CHECK(contains(r.err, "drun: forgetting the learned hang timeouts"));
  CHECK(r.status() == 0);
  CHECK(contains(r.out, "rank 1 done in attempt 1"));
}

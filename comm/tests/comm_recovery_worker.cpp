// comm_recovery_worker: one rank of the in-process recovery tests (comm_recovery_test.cpp),
// started by the test with RANK, WORLD_SIZE, DRUN_WORKER_STORE(_PREFIX), DRUN_GENERATION and
// DRUN_COMM_TRANSPORT set; the test plays drun's agent in the workers' store. Modes:
//   lost V     rank V waits to be SIGKILLed; the others' pending all_reduce must fail naming
//              rank V, then they reform(); a replacement (DRUN_GENERATION > 0) joins; every
//              rank checks an all_reduce of the new generation
//   bump [L]   every rank's pending operation (rank 0 a receive, the others an all_reduce) must
//              fail once the test bumps the generation; it prints how long after the bump (the
//              test writes test/bumped_at_ns, steady clock, before it bumps); a group made before
//              must refuse after reform(). With L: rank L reforms only once generation 2 began
//              (the others are forming 1 by then and must abandon it)
//   grow       a grow (docs/recovery.md "Elastic in place"): rank 0's receive from rank 1 is
//              pending when the test opens a generation that adds a rank; it must not fail:
//              rank 1 sends once the test says so (test/send), after the generation began; then
//              both reform() into the larger world, which the newcomer (DRUN_GENERATION > 0)
//              joins, and every rank checks an all_reduce of it
//   loop N     N reforms in a row, rank 0 bumping the generation once every rank checked its
//              all_reduce; fds, threads, memfd mappings and RSS printed before and after
// Prints "rank R: ok generation G (N checks)" and exits 0, or what went wrong and exits 1.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "drun/comm/communicator.hpp"
#include "drun/store/prefix_store.hpp"
#include "drun/store/tcp_store.hpp"
#include "worker_checks.hpp"

using namespace drun::comm;
using namespace std::chrono_literals;

namespace {

WorkerChecks tally;
int me = 0;

// The workers' store as the test and drun's agent see it (keys under the job's prefix).
std::shared_ptr<drun::rdzv::LivenessStore> workersStore() {
  // HOST:PORT as the agent writes it (libdrun_comm does not export HostPort::parse).
  const std::string at = std::getenv("DRUN_WORKER_STORE");
  const size_t colon = at.rfind(':');
  drun::rdzv::TcpStoreOptions o;
  o.endpoint = {at.substr(0, colon), static_cast<uint16_t>(std::stoi(at.substr(colon + 1)))};
  o.connectTimeout = 10s;
  o.timeout = 20s;
  const char* prefix = std::getenv("DRUN_WORKER_STORE_PREFIX");
  return std::make_shared<drun::rdzv::PrefixStore>(prefix ? prefix : "", std::make_shared<drun::rdzv::TcpStore>(o));
}

uint64_t storeGeneration(drun::rdzv::LivenessStore& store) {
  auto v = store.tryGet("recovery/generation");
  return v ? std::stoull(*v) : 0;
}

// Until recovery/generation >= g (20 s at most).
void awaitGeneration(drun::rdzv::LivenessStore& store, uint64_t g) {
  auto known = store.tryGet("recovery/generation");
  const auto until = std::chrono::steady_clock::now() + 20s;
  while ((known ? std::stoull(*known) : 0) < g && std::chrono::steady_clock::now() < until)
    try {
      known = store.watch("recovery/generation", known, 1s);
    } catch (const drun::TimeoutError&) {
    }
}

// An all_reduce every rank checks: 8 bytes and 256 KiB, the sum of rank + 1 over the world (its
// rank and size now: a shrink renumbers them).
void checkedAllReduce(Communicator& world, const char* when) {
  const int n = world.size();
  int64_t x = world.rank() + 1;
  world.allReduce(&x, 1, DType::Int64, ReduceOp::Sum, 20s);
  tally.check(x == int64_t{n} * (n + 1) / 2, std::string(when) + ": 8-byte all_reduce gave " + std::to_string(x));
  std::vector<float> v(1 << 16, static_cast<float>(world.rank() + 1));
  world.allReduce(v.data(), v.size(), DType::Float32, ReduceOp::Sum, 20s);
  tally.check(v.front() == n * (n + 1) / 2.0f && v.back() == v.front(), std::string(when) + ": 256 KiB all_reduce");
}

// The pending operation of a communicator whose generation ends: it must fail with CommError.
template <class Op>
std::string expectFailure(Op&& op, const char* what) {
  try {
    op();
    tally.check(false, std::string(what) + " did not fail");
  } catch (const drun::CommError& e) {
    return e.what();
  } catch (const std::exception& e) {
    tally.check(false, std::string(what) + " failed with another error: " + e.what());
  }
  return {};
}

long countEntries(const char* dir) {
  std::error_code ec;
  long n = 0;
  for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != std::filesystem::directory_iterator(); ++it) ++n;
  return n;
}

// fds, threads, memfd mappings, RSS (KiB).
std::vector<long> resources() {
  long maps = 0, rss = 0;
  std::ifstream m("/proc/self/maps");
  for (std::string line; std::getline(m, line);) maps += line.find("memfd:drun-comm") != std::string::npos;
  std::ifstream statm("/proc/self/statm");
  long size = 0, pages = 0;
  statm >> size >> pages;
  rss = pages * (sysconf(_SC_PAGESIZE) / 1024);
  return {countEntries("/proc/self/fd"), countEntries("/proc/self/task"), maps, rss};
}

void lost(Communicator& world, int victim) {
  if (world.generation() > 0) {  // the replacement
    std::printf("rank %d: joined generation %llu\n", me, static_cast<unsigned long long>(world.generation()));
    checkedAllReduce(world, "replacement");
    return;
  }
  checkedAllReduce(world, "generation 0");
  if (me == victim) {
    std::printf("rank %d: waiting to be killed\n", me);
    std::fflush(stdout);
    std::this_thread::sleep_for(60s);
    return;
  }
  std::printf("rank %d: pending\n", me);
  std::fflush(stdout);
  int64_t x = 1;
  std::string error = expectFailure([&] { world.allReduce(&x, 1, DType::Int64, ReduceOp::Sum, 20s); }, "all_reduce");
  std::printf("rank %d: failed: %s\n", me, error.c_str());
  tally.check(error.find("rank " + std::to_string(victim)) != std::string::npos, "the error names rank " + std::to_string(victim));
  world.reform(20s);
  std::printf("rank %d: reformed generation %llu as rank %d of %d\n", me,
              static_cast<unsigned long long>(world.generation()), world.rank(), world.size());
  checkedAllReduce(world, "after reform");
}

void bump(Communicator& world, int late) {
  auto store = workersStore();
  checkedAllReduce(world, "generation 0");
  auto group = world.newGroup({0, 1});
  std::printf("rank %d: pending\n", me);
  std::fflush(stdout);
  std::string error;
  if (me == 0) {
    int64_t never = 0;
    error = expectFailure([&] { world.recv(&never, 1, DType::Int64, 1, 99, 20s); }, "recv");
  } else {
    int64_t x = 1;
    error = expectFailure([&] { world.allReduce(&x, 1, DType::Int64, ReduceOp::Sum, 20s); }, "all_reduce");
  }
  const auto failedAt = std::chrono::steady_clock::now().time_since_epoch();
  auto bumpedAt = store->tryGet("test/bumped_at_ns");
  const double ms = bumpedAt ? (std::chrono::duration_cast<std::chrono::nanoseconds>(failedAt).count() -
                                std::stoll(*bumpedAt)) / 1e6
                             : -1;
  std::printf("rank %d: failed %.3f ms after the bump: %s\n", me, ms, error.c_str());
  std::fflush(stdout);
  tally.check(error.find("generation 1 began") != std::string::npos, "the error names generation 1");
  if (me == late) awaitGeneration(*store, 2);
  world.reform(20s);
  std::printf("rank %d: reformed generation %llu\n", me, static_cast<unsigned long long>(world.generation()));
  tally.check(world.generation() == storeGeneration(*store), "reformed to the newest generation");
  if (group->isMember()) {
    int64_t y = 0;
    try {
      group->allReduce(&y, 1, DType::Int64, ReduceOp::Sum, 5s);
      tally.check(false, "a group of generation 0 still worked after reform");
    } catch (const drun::InvalidArgument& e) {
      tally.check(std::string(e.what()).find("belongs to generation 0") != std::string::npos,
                  std::string("the old group's error: ") + e.what());
    }
  }
  checkedAllReduce(world, "after reform");
  auto again = world.newGroup({0, 1});  // made again: usable
  if (again->isMember()) {
    int64_t y = 1;
    again->allReduce(&y, 1, DType::Int64, ReduceOp::Sum, 20s);
    tally.check(y == 2, "the group made again");
  }
}

void grow(Communicator& world) {
  if (world.generation() > 0) {  // the newcomer
    std::printf("rank %d: joined generation %llu as rank %d of %d\n", me,
                static_cast<unsigned long long>(world.generation()), world.rank(), world.size());
    checkedAllReduce(world, "newcomer");
    return;
  }
  auto store = workersStore();
  checkedAllReduce(world, "generation 0");
  std::printf("rank %d: pending\n", me);
  std::fflush(stdout);
  int64_t v = 0;
  if (me == 0) {
    world.recv(&v, 1, DType::Int64, 1, 7, 20s);
    std::printf("rank %d: received %lld across the grow\n", me, static_cast<long long>(v));
    tally.check(v == 42, "the receive pending across the grow got what rank 1 sent");
  } else if (me == 1) {
    store->wait({"test/send"}, 20s);
    tally.check(storeGeneration(*store) >= 1, "the grow began before the send");
    v = 42;
    world.send(&v, 1, DType::Int64, 0, 7, 20s);
  }
  awaitGeneration(*store, 1);
  world.reform(20s);
  std::printf("rank %d: reformed generation %llu as rank %d of %d\n", me,
              static_cast<unsigned long long>(world.generation()), world.rank(), world.size());
  checkedAllReduce(world, "after the grow");
}

void loop(Communicator& world, int reforms) {
  auto store = workersStore();
  std::vector<long> before;
  for (int i = 0; i <= reforms; ++i) {
    if (i == 5) before = resources();  // after the first reforms made what lasts (Gloo's device)
    checkedAllReduce(world, ("iteration " + std::to_string(i)).c_str());
    if (i == reforms) break;
    const uint64_t g = world.generation();
    store->set("test/done/" + std::to_string(g) + "/" + std::to_string(me), "1");
    if (me == 0) {
      std::vector<std::string> done;
      for (int r = 0; r < world.size(); ++r) done.push_back("test/done/" + std::to_string(g) + "/" + std::to_string(r));
      store->wait(done, 20s);
      store->compareSet("recovery/generation", g == 0 ? "" : std::to_string(g), std::to_string(g + 1));
    }
    awaitGeneration(*store, g + 1);
    world.reform(20s);
  }
  const std::vector<long> after = resources();
  std::printf("rank %d: %s after %d reforms: fds %ld -> %ld, threads %ld -> %ld, memfd maps %ld -> %ld, RSS %ld -> %ld KiB\n",
              me, world.transport().c_str(), reforms, before[0], after[0], before[1], after[1], before[2], after[2],
              before[3], after[3]);
  tally.check(after[0] <= before[0] + 4, "fds flat");
  tally.check(after[1] <= before[1] + 2, "threads flat");
  tally.check(after[2] <= before[2], "memfd mappings flat");
  tally.check(after[3] <= before[3] + 64 * 1024, "RSS flat (64 MiB)");
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  const int arg = argc > 2 ? std::atoi(argv[2]) : -1;
  try {
    InitOptions o;
    o.timeout = 20s;
    auto world = init(o);
    me = world->rank();
    tally.rank = me;
    std::printf("rank %d: init generation %llu (%s)\n", me, static_cast<unsigned long long>(world->generation()),
                world->transport().c_str());
    std::fflush(stdout);
    if (mode == "lost") lost(*world, arg);
    else if (mode == "bump") bump(*world, arg);
    else if (mode == "loop") loop(*world, arg);
    else if (mode == "grow") grow(*world);
    else {
      std::fprintf(stderr, "comm_recovery_worker: unknown mode '%s'\n", mode.c_str());
      return 2;
    }
    const uint64_t g = world->generation();
    world->destroy();
    std::printf("rank %d: generation %llu\n", me, static_cast<unsigned long long>(g));
  } catch (const std::exception& e) {
    std::printf("rank %d: ERROR %s\n", me, e.what());
    return 1;
  }
  return tally.report();
}

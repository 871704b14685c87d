// synchronizing: the seeds' barrier example. Each rank runs two tasks of different lengths; with
// --barrier no rank starts task 1 before every rank finished task 0. Each line carries the
// monotonic clock (ms, the same on every process of a machine) so the order can be checked.
// Run: drun --standalone --nproc-per-node 4 build/bin/synchronizing --barrier
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "drun/comm/communicator.hpp"

namespace {
double nowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
}  // namespace

int main(int argc, char** argv) {
  bool barrier = argc > 1 && std::strcmp(argv[1], "--barrier") == 0;
  try {
    auto world = drun::comm::init();
    const int rank = world->rank(), size = world->size();
    for (int task = 0; task < 2; ++task) {
      std::printf("Task %d starts on rank %d/%d at %.3f\n", task, rank, size, nowMs());
      std::fflush(stdout);
      // The task takes a different time on each rank.
      std::this_thread::sleep_for(std::chrono::milliseconds(50 * (rank + 1)));
      if (barrier) world->barrier();
      std::printf("Task %d ends on rank %d/%d at %.3f\n", task, rank, size, nowMs());
      std::fflush(stdout);
    }
    world->destroy();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "synchronizing: %s\n", e.what());
    return 1;
  }
}

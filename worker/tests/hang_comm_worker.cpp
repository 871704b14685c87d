// A libdrun_comm worker for the hang tests: beats through 5 all_reduces, then rank --hang-rank
// stops before the 6th (it sleeps, silent, outside any collective) while the others wait in it.
// --loop-seconds S: first S seconds of steps of 1 ms of work (a sleep: the rank is outside any
// collective at almost every moment) and a small all_reduce, with no heartbeat of its own
// (libdrun_comm's collectives are what beats), then the 5 steps.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "drun/comm/communicator.hpp"
#include "drun/worker.hpp"

int main(int argc, char** argv) {
  int hangRank = -1;
  double loopSeconds = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--hang-rank") == 0) hangRank = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--loop-seconds") == 0) loopSeconds = std::atof(argv[i + 1]);
  }
  try {
    auto world = drun::comm::init();
    float x = 1;
    const auto start = std::chrono::steady_clock::now();
    for (int64_t it = 1, stop = loopSeconds <= 0; !stop; ++it) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // work, not synchronisation
      world->allReduce(&x, 1, drun::comm::DType::Float32, drun::comm::ReduceOp::Max);
      if (it % 64 != 0) continue;
      // Rank 0's clock decides for everyone: the ranks run the same collectives.
      stop = std::chrono::steady_clock::now() - start > std::chrono::duration<double>(loopSeconds);
      world->broadcast(&stop, 1, drun::comm::DType::Int64, 0);
    }
    for (int step = 0; step < 5; ++step) {
      world->allReduce(&x, 1, drun::comm::DType::Float32, drun::comm::ReduceOp::Sum);
      drun::worker::heartbeat();
    }
    if (world->rank() == hangRank) {
      std::printf("rank %d stops before all_reduce #6\n", world->rank());
      std::fflush(stdout);
      for (;;) ::pause();
    }
    world->allReduce(&x, 1, drun::comm::DType::Float32, drun::comm::ReduceOp::Sum, std::chrono::seconds(60));
    world->destroy();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hang_comm_worker: %s\n", e.what());
    return 1;
  }
}

// A libdrun_comm worker for the hang tests: beats through 5 all_reduces, then rank --hang-rank
// stops before the 6th (it sleeps, silent, outside any collective) while the others wait in it.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "drun/comm/communicator.hpp"
#include "drun/worker.hpp"

int main(int argc, char** argv) {
  const int hangRank = argc > 2 && std::strcmp(argv[1], "--hang-rank") == 0 ? std::atoi(argv[2]) : -1;
  try {
    auto world = drun::comm::init();
    float x = 1;
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

// send_recv: blocking point-to-point, as in the seeds: rank 0 increments a tensor and sends it to
// rank 1, which receives it. Run: drun --standalone --nproc-per-node 2 build/bin/send_recv
#include <cstdio>

#include "drun/comm/communicator.hpp"

using namespace drun::comm;

int main() {
  try {
    auto world = init();
    float tensor = 0;
    if (world->rank() == 0) {
      tensor += 1;
      world->send(&tensor, 1, DType::Float32, /*dst=*/1);
    } else if (world->rank() == 1) {
      world->recv(&tensor, 1, DType::Float32, /*src=*/0);
    }
    std::printf("Rank %d has data %.1f\n", world->rank(), tensor);
    world->destroy();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "send_recv: %s\n", e.what());
    return 1;
  }
}

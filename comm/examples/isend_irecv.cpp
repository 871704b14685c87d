// isend_irecv: non-blocking point-to-point: the requests run while the rank goes on, wait()
// completes them. Run: drun --standalone --nproc-per-node 2 build/bin/isend_irecv
#include <cstdio>

#include "drun/comm/communicator.hpp"

using namespace drun::comm;

int main() {
  try {
    auto world = init();
    float tensor = 0;
    Request req;
    if (world->rank() == 0) {
      tensor += 1;
      req = world->isend(&tensor, 1, DType::Float32, 1);
      std::printf("Rank 0 started sending\n");
    } else if (world->rank() == 1) {
      req = world->irecv(&tensor, 1, DType::Float32, 0);
      std::printf("Rank 1 started receiving\n");
    }
    if (req.valid()) req.wait();
    std::printf("Rank %d has data %.1f\n", world->rank(), tensor);
    world->destroy();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "isend_irecv: %s\n", e.what());
    return 1;
  }
}

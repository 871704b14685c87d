// group_all_reduce: all_reduce within a sub-group, as in the seeds: every rank calls new_group
// with ranks {0, 1}; the members sum a tensor of ones, the others keep theirs.
// Run: drun --standalone --nproc-per-node 4 build/bin/group_all_reduce
#include <cstdio>

#include "drun/comm/communicator.hpp"

using namespace drun::comm;

int main() {
  try {
    auto world = init();
    auto group = world->newGroup({0, 1});
    float tensor = 1;
    if (group->isMember()) group->allReduce(&tensor, 1, DType::Float32, ReduceOp::Sum);
    std::printf("Rank %d has data %.1f\n", world->rank(), tensor);
    world->destroy();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "group_all_reduce: %s\n", e.what());
    return 1;
  }
}

// all_gather: every rank contributes its rank and receives everyone's, in rank order.
// Run: drun --standalone --nproc-per-node 4 build/bin/all_gather
#include <cstdio>
#include <string>
#include <vector>

#include "drun/comm/communicator.hpp"

using namespace drun::comm;

int main() {
  try {
    auto world = init();
    int64_t mine = world->rank();
    std::vector<int64_t> all(world->size());
    world->allGather(&mine, all.data(), 1, DType::Int64);
    std::string text;
    for (int64_t v : all) text += " " + std::to_string(v);
    std::printf("Rank %d gathered:%s\n", world->rank(), text.c_str());
    world->destroy();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "all_gather: %s\n", e.what());
    return 1;
  }
}

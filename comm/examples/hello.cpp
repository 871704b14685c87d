// hello: init from the environment drun sets, print rank and world size (the seeds' first
// program). Run: drun --standalone --nproc-per-node 4 build/bin/hello
#include <cstdio>

#include "drun/comm/communicator.hpp"

int main() {
  try {
    auto world = drun::comm::init();  // env://, backend gloo
    std::printf("Hello from rank %d of %d\n", world->rank(), world->size());
    world->destroy();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hello: %s\n", e.what());
    return 1;
  }
}

#include <cstdio>

#include <drun/comm/communicator.hpp>

int main() {
  auto world = drun::comm::init();
  float v = 1;
  world->allReduce(&v, 1, drun::comm::DType::Float32, drun::comm::ReduceOp::Sum);
  std::printf("user_cpp rank %d: %.0f\n", world->rank(), v);
  try {
    world->barrier(std::chrono::milliseconds(-1000));
  } catch (const drun::InvalidArgument& e) {  // the error types work across the library boundary
    std::printf("user_cpp rank %d: caught InvalidArgument\n", world->rank());
  }
}

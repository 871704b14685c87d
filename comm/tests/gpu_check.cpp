// comm_gpu_check: the NCCL backend's run-time checks, world size 1 (one GPU cannot host two NCCL
// ranks). A CTest test labelled gpu: exits 77 (CTest's SKIP_RETURN_CODE) with a reason when
// NCCL is not built in or no CUDA device is present, never a silent pass.
#include <cstdio>
#include <vector>

#include "drun/comm/communicator.hpp"
#include "drun/rendezvous/memory_store.hpp"

#ifdef DRUN_HAVE_NCCL
#include <cuda_runtime.h>
#endif

using namespace drun::comm;
using namespace std::chrono_literals;

namespace {
int failures = 0;
void check(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what);
  if (!ok) ++failures;
}
}  // namespace

int main() {
#ifndef DRUN_HAVE_NCCL
  std::printf("SKIPPED: NCCL was not built in\n");
  return 77;
#else
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device (cudaGetDeviceCount reports %d)\n", devices);
    return 77;
  }
  try {
    InitOptions o;
    o.backend = Backend::Nccl;
    o.rank = 0;
    o.worldSize = 1;
    o.timeout = 60s;
    o.device = 0;
    auto world = init(std::make_shared<drun::rdzv::MemoryStore>(), o);
    const size_t n = (1 << 20) / sizeof(float) + 3;
    std::vector<float> host(n), back(n);
    for (size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 97);
    float *dev = nullptr, *out = nullptr;
    cudaMalloc(&dev, n * sizeof(float));
    cudaMalloc(&out, n * sizeof(float));
    cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);

    world->allReduce(dev, n, DType::Float32, ReduceOp::Sum);
    world->allReduce(dev, n, DType::Float32, ReduceOp::Avg);
    world->broadcast(dev, n, DType::Float32, 0);
    cudaMemcpy(back.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost);
    check(back == host, "all_reduce sum/avg and broadcast keep a world of one's data");

    world->allGather(dev, out, n, DType::Float32);
    world->reduceScatter(out, dev, n, DType::Float32, ReduceOp::Max);
    world->allToAll(dev, out, n, DType::Float32);
    world->allReduceAsync(out, n, DType::Float32, ReduceOp::Min).wait();
    cudaMemcpy(back.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost);
    check(back == host, "all_gather, reduce_scatter, all_to_all, async all_reduce");
    world->barrier();
    check(true, "barrier");

    bool refused = false;
    try {
      world->allReduce(dev, n, DType::Int32, ReduceOp::BXor);
    } catch (const drun::InvalidArgument& e) {
      refused = true;
    }
    check(refused, "bitwise ops are refused by the nccl backend with InvalidArgument");
    world->destroy();
    cudaFree(dev);
    cudaFree(out);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  return failures ? 1 : 0;
#endif
}

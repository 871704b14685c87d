// comm_gpu_check: the NCCL backend's run-time checks, world size 1 (one GPU cannot host two NCCL
// ranks). A CTest test labelled gpu: exits 77 (CTest's SKIP_RETURN_CODE) with a reason when
// NCCL is not built in or no CUDA device is present, never a silent pass.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "drun/comm/communicator.hpp"
#include "drun/store/memory_store.hpp"

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

    // Requests polled from two threads while the main thread enqueues more and then destroys the
    // communicator (the handle is used under one lock, so destroying it cannot free it under the
    // pollers): every request ends done or with drun's error, nothing crashes.
    {
      std::vector<Request> requests;
      for (int i = 0; i < 64; ++i) requests.push_back(world->allReduceAsync(dev, n, DType::Float32, ReduceOp::Sum));
      std::atomic<int> done{0}, failed{0};
      auto poller = [&] {
        for (auto& r : requests) {
          const auto until = std::chrono::steady_clock::now() + 20s;
          try {
            while (!r.test() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
            ++done;
          } catch (const drun::Error&) {
            ++failed;
          } catch (const std::exception& e) {  // not drun's: counted in neither (the check fails)
            std::printf("FAIL: a poll threw %s\n", e.what());
          }
        }
      };
      std::thread a(poller), b(poller);
      for (int i = 0; i < 64; ++i) world->allReduceAsync(out, n, DType::Float32, ReduceOp::Max);
      world->destroy();  // while the pollers poll
      a.join();
      b.join();
      check(done + failed == 128, "requests polled from two threads across destroy all end (done or drun's error)");
    }
    cudaFree(dev);
    cudaFree(out);

    // A world of 2 whose rank 1 never comes: init fails within its timeout, naming the timeout,
    // instead of waiting in NCCL for ever.
    InitOptions lonely = o;
    lonely.worldSize = 2;
    lonely.timeout = 3s;
    const auto start = std::chrono::steady_clock::now();
    bool timedOut = false;
    try {
      init(std::make_shared<drun::rdzv::MemoryStore>(), lonely);
    } catch (const drun::Error& e) {
      std::printf("init without rank 1: %s\n", e.what());
      timedOut = true;
    }
    const auto took = std::chrono::steady_clock::now() - start;
    check(timedOut && took < 15s, "init of a world of 2 without rank 1 fails within its timeout");
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  return failures ? 1 : 0;
#endif
}

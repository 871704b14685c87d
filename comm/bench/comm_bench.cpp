// drun-comm-bench: collective bandwidth and latency of drun::comm, in nccl-tests' form.
//   drun --standalone --nproc-per-node 4 build/bin/drun-comm-bench --op all_reduce
//        --min-bytes 8 --max-bytes 64M --factor 2 --iters 20 --warmup 5 [--backend gloo|nccl] [--check]
// Time per size: the slowest rank's average over --iters after --warmup, float32 (sum).
#include <chrono>
#include <cstdio>
#include <vector>

#include "bench_table.hpp"
#include "drun/comm/communicator.hpp"

#ifdef DRUN_HAVE_NCCL
#include <cuda_runtime.h>
#endif

using namespace drun::comm;

namespace {

// The op's send and receive buffers, on the host (gloo) or the device (nccl).
class Buffers {
 public:
  Buffers(bool device, size_t sendFloats, size_t recvFloats) : device_(device) {
    sendHost_.resize(sendFloats);
    recvHost_.resize(recvFloats);
#ifdef DRUN_HAVE_NCCL
    if (device_) {
      cudaMalloc(&send_, sendFloats * sizeof(float));
      cudaMalloc(&recv_, recvFloats * sizeof(float));
      return;
    }
#endif
    send_ = sendHost_.data();
    recv_ = recvHost_.data();
  }
  ~Buffers() {
#ifdef DRUN_HAVE_NCCL
    if (device_) cudaFree(send_), cudaFree(recv_);
#endif
  }
  float* send() { return static_cast<float*>(send_); }
  float* recv() { return static_cast<float*>(recv_); }
  std::vector<float>& sendHost() { return sendHost_; }
  // Host copies <-> the op's buffers (no-ops on the host backend).
  void upload() {
#ifdef DRUN_HAVE_NCCL
    if (device_) cudaMemcpy(send_, sendHost_.data(), sendHost_.size() * sizeof(float), cudaMemcpyHostToDevice);
#endif
  }
  const std::vector<float>& download(bool fromSend) {
    std::vector<float>& host = fromSend ? sendHost_ : recvHost_;
#ifdef DRUN_HAVE_NCCL
    if (device_) cudaMemcpy(host.data(), fromSend ? send_ : recv_, host.size() * sizeof(float), cudaMemcpyDeviceToHost);
#endif
    return host;
  }

 private:
  bool device_;
  std::vector<float> sendHost_, recvHost_;
  void* send_ = nullptr;
  void* recv_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    drun::bench::Args a = drun::bench::parseArgs(argc, argv);
    InitOptions o;
    o.backend = parseBackend(a.backend.c_str());
    auto world = init(o);
    const int n = world->size(), r = world->rank();
    const bool allReduce = a.op == "all_reduce";
    if (r == 0) drun::bench::printHeader(a, n, "drun::comm");
    double busbwSum = 0;
    int rows = 0;
    for (size_t bytes = a.minBytes; bytes <= a.maxBytes;
         bytes = std::max(bytes + 1, static_cast<size_t>(bytes * a.factor))) {
      // count: elements per rank's block (the whole buffer for all_reduce).
      const size_t count = allReduce ? std::max<size_t>(1, bytes / 4) : std::max<size_t>(1, bytes / 4 / n);
      const size_t total = allReduce ? count : count * n;
      const size_t sendFloats = a.op == "all_gather" ? count : total;
      const size_t recvFloats = a.op == "reduce_scatter" ? count : total;
      Buffers buf(o.backend == Backend::Nccl, sendFloats, recvFloats);
      auto runOnce = [&] {
        if (a.op == "all_reduce") world->allReduce(buf.send(), count, DType::Float32, ReduceOp::Sum);
        else if (a.op == "all_gather") world->allGather(buf.send(), buf.recv(), count, DType::Float32);
        else if (a.op == "reduce_scatter") world->reduceScatter(buf.send(), buf.recv(), count, DType::Float32, ReduceOp::Sum);
        else world->allToAll(buf.send(), buf.recv(), count, DType::Float32);
      };
      for (int i = 0; i < a.warmup; ++i) runOnce();
      world->barrier();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < a.iters; ++i) runOnce();
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / a.iters;
      world->allReduce(&us, 1, DType::Float64, ReduceOp::Max);

      long wrong = 0;
      if (a.check) {  // rank k sends k+1 (all_to_all: 1000k + destination block index)
        auto& in = buf.sendHost();
        for (size_t i = 0; i < in.size(); ++i) in[i] = a.op == "all_to_all" ? 1000.0f * r + i / count : r + 1.0f;
        buf.upload();
        runOnce();
        const auto& out = buf.download(allReduce);
        for (size_t i = 0; i < out.size(); ++i) {
          float want = a.op == "all_gather" ? static_cast<float>(i / count + 1)
                     : a.op == "all_to_all" ? 1000.0f * (i / count) + r
                                            : n * (n + 1) / 2.0f;
          wrong += out[i] != want;
        }
        world->allReduce(&wrong, 1, DType::Int64, ReduceOp::Sum);
      }
      const size_t reported = total * sizeof(float);
      if (r == 0) drun::bench::printRow(a, n, reported, us, wrong);
      busbwSum += reported / (us * 1e3) * drun::bench::busFactor(a.op, n);
      ++rows;
    }
    if (r == 0) drun::bench::printFooter(busbwSum, rows);
    world->destroy();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "drun-comm-bench: %s\n", e.what());
    return 1;
  }
}

// drun-comm-bench: collective bandwidth and latency of drun::comm, in nccl-tests' form.
//   drun --standalone --nproc-per-node 4 build/bin/drun-comm-bench --op all_reduce
//        --min-bytes 8 --max-bytes 64M --factor 2 --iters 20 --warmup 5 [--backend gloo|nccl] [--check]
// Time per size: the slowest rank's average over --iters after --warmup, float32 (sum).
#include <algorithm>
#include <cstdio>
#include <string>
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

// A host value reduced over the ranks. NCCL reduces device memory only: through a device copy
// there (a host pointer faults in NCCL's kernel at world 2 and more; world 1's in-place
// all_reduce touches nothing, which hid it).
template <class T>
T reduceValue(Communicator& world, bool device, T v, DType dtype, ReduceOp op) {
#ifdef DRUN_HAVE_NCCL
  if (device) {
    void* d = nullptr;
    cudaMalloc(&d, sizeof(T));
    cudaMemcpy(d, &v, sizeof(T), cudaMemcpyHostToDevice);
    world.allReduce(d, 1, dtype, op);
    cudaMemcpy(&v, d, sizeof(T), cudaMemcpyDeviceToHost);
    cudaFree(d);
    return v;
  }
#else
  (void)device;
#endif
  world.allReduce(&v, 1, dtype, op);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    drun::bench::Args a = drun::bench::parseArgs(argc, argv);
    InitOptions o;
    o.backend = parseBackend(a.backend.c_str());
    auto world = init(o);
    const int n = world->size(), r = world->rank();
    const bool allReduce = a.op == "all_reduce" || a.op == "reduce" || a.op == "broadcast";  // the result in send()
    const std::string impl = "drun::comm (" + world->transport() + ")";
    if (r == 0) drun::bench::printHeader(a, n, impl.c_str());
    drun::bench::sweep(a, n, r == 0, [&](size_t count, size_t total) {
      Buffers buf(o.backend == Backend::Nccl, a.op == "all_gather" ? count : total,
                  a.op == "reduce_scatter" ? count : total);
      auto runOnce = [&] {
        if (a.op == "all_reduce") world->allReduce(buf.send(), count, DType::Float32, ReduceOp::Sum);
        else if (a.op == "broadcast") world->broadcast(buf.send(), count, DType::Float32, 0);
        else if (a.op == "reduce") world->reduce(buf.send(), count, DType::Float32, ReduceOp::Sum, 0);
        else if (a.op == "all_gather") world->allGather(buf.send(), buf.recv(), count, DType::Float32);
        else if (a.op == "reduce_scatter") world->reduceScatter(buf.send(), buf.recv(), count, DType::Float32, ReduceOp::Sum);
        else world->allToAll(buf.send(), buf.recv(), count, DType::Float32);
      };
      const bool device = o.backend == Backend::Nccl;
      double us = drun::bench::timeIt(a, runOnce, [&] { world->barrier(); }, [&](double v) {
        return reduceValue(*world, device, v, DType::Float64, ReduceOp::Max);
      });

      int64_t wrong = 0;
      if (a.check) {  // rank k sends k+1 (all_to_all: 1000k + destination block index)
        auto& in = buf.sendHost();
        for (size_t i = 0; i < in.size(); ++i) in[i] = a.op == "all_to_all" ? 1000.0f * r + i / count : r + 1.0f;
        if (a.op == "broadcast" && r != 0) std::fill(in.begin(), in.end(), 0.0f);
        buf.upload();
        runOnce();
        const auto& out = buf.download(allReduce);
        for (size_t i = 0; i < out.size() && (a.op != "reduce" || r == 0); ++i) {  // reduce: root 0's
          float want = a.op == "broadcast"    ? 1.0f
                     : a.op == "all_gather" ? static_cast<float>(i / count + 1)
                     : a.op == "all_to_all" ? 1000.0f * (i / count) + r
                                            : n * (n + 1) / 2.0f;
          wrong += out[i] != want;
        }
        wrong = reduceValue<int64_t>(*world, device, wrong, DType::Int64, ReduceOp::Sum);
      }
      return std::pair{us, static_cast<long>(wrong)};
    });
    world->destroy();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "drun-comm-bench: %s\n", e.what());
    return 1;
  }
}

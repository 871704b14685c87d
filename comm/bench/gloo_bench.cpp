// drun-comm-bench-gloo: the reference for drun-comm-bench: a plain Gloo program (no drun code)
// running the same Gloo algorithms on the same transport, printing the same table. Run under
// drun (it reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); ranks meet through Gloo's own
// FileStore in $TMPDIR/drun-gloo-bench-<MASTER_PORT>.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "bench_table.hpp"

namespace {

int envInt(const char* name) {
  const char* v = std::getenv(name);
  if (!v) throw std::invalid_argument(std::string(name) + " is not set (run under drun)");
  return std::atoi(v);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    drun::bench::Args a = drun::bench::parseArgs(argc, argv);
    const int r = envInt("RANK"), n = envInt("WORLD_SIZE");
    const char* tmp = std::getenv("TMPDIR");
    std::filesystem::path dir = std::filesystem::path(tmp ? tmp : "/tmp") /
                                ("drun-gloo-bench-" + std::to_string(envInt("MASTER_PORT")));
    std::filesystem::create_directories(dir);
    gloo::rendezvous::FileStore store(dir.string());
    gloo::transport::tcp::attr attr;
    attr.hostname = std::getenv("MASTER_ADDR");
    if (attr.hostname == "localhost") attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(r, n);
    context->connectFullMesh(store, device);

    auto barrier = [&] {
      gloo::BarrierOptions o(context);
      gloo::barrier(o);
    };
    auto maxOf = [&](double v) {
      gloo::AllreduceOptions o(context);
      o.setOutput(&v, 1);
      o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<double>));
      gloo::allreduce(o);
      return v;
    };
    const bool allReduce = a.op == "all_reduce";
    if (r == 0) drun::bench::printHeader(a, n, "raw gloo");
    double busbwSum = 0;
    int rows = 0;
    uint32_t tag = 0;
    for (size_t bytes = a.minBytes; bytes <= a.maxBytes;
         bytes = std::max(bytes + 1, static_cast<size_t>(bytes * a.factor))) {
      const size_t count = allReduce ? std::max<size_t>(1, bytes / 4) : std::max<size_t>(1, bytes / 4 / n);
      const size_t total = allReduce ? count : count * n;
      std::vector<float> send(a.op == "all_gather" ? count : total), recv(total), out(count);
      auto runOnce = [&] {
        if (a.op == "all_reduce") {
          gloo::AllreduceOptions o(context);
          o.setOutput(send.data(), count);
          o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
          o.setTag(tag++);
          gloo::allreduce(o);
        } else if (a.op == "all_gather") {
          gloo::AllgatherOptions o(context);
          o.setInput(send.data(), count);
          o.setOutput(recv.data(), total);
          o.setTag(tag++);
          gloo::allgather(o);
        } else {  // all_to_all; reduce_scatter = all_to_all + the local sum of the n blocks
          gloo::AlltoallOptions o(context);
          o.setInput(send.data(), total);
          o.setOutput(recv.data(), total);
          o.setTag(tag++);
          gloo::alltoall(o);
          if (a.op == "reduce_scatter") {
            std::copy(recv.begin(), recv.begin() + count, out.begin());
            for (int k = 1; k < n; ++k) gloo::sum<float>(out.data(), out.data(), recv.data() + k * count, count);
          }
        }
      };
      for (int i = 0; i < a.warmup; ++i) runOnce();
      barrier();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < a.iters; ++i) runOnce();
      double us = maxOf(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / a.iters);
      const size_t reported = total * sizeof(float);
      if (r == 0) drun::bench::printRow(a, n, reported, us, 0);
      busbwSum += reported / (us * 1e3) * drun::bench::busFactor(a.op, n);
      ++rows;
    }
    if (r == 0) drun::bench::printFooter(busbwSum, rows);
    barrier();
    if (r == 0) std::filesystem::remove_all(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "drun-comm-bench-gloo: %s\n", e.what());
    return 1;
  }
}

// drun-comm-bench-gloo: the reference for drun-comm-bench: a plain Gloo program (no drun code)
// running the same Gloo algorithms on the same transport, printing the same table. Run under
// drun (it reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); ranks meet through Gloo's own
// FileStore in $TMPDIR/drun-gloo-bench-<MASTER_PORT>.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "bench_table.hpp"

namespace {

// The local address whose route reaches `host` (a connected UDP socket sends nothing).
std::string addressRouting(const char* host) {
  if (!host) throw std::invalid_argument("MASTER_ADDR is not set (run under drun)");
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host, "9", &hints, &res) != 0 || !res) throw std::invalid_argument(std::string("cannot resolve ") + host);
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  char text[INET_ADDRSTRLEN] = {};
  bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
            inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  if (!ok) throw std::invalid_argument(std::string("no local address routes to ") + host);
  return text;
}

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
    attr.hostname = addressRouting(std::getenv("MASTER_ADDR"));  // this host's, also on several hosts
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
    if (r == 0) drun::bench::printHeader(a, n, "raw gloo");
    uint32_t tag = 0;
    drun::bench::sweep(a, n, r == 0, [&](size_t count, size_t total) {
      std::vector<float> send(a.op == "all_gather" ? count : total), recv(total), out(count);
      auto runOnce = [&] {
        if (a.op == "all_reduce") {
          gloo::AllreduceOptions o(context);
          o.setOutput(send.data(), count);
          o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
          o.setTag(tag++);
          gloo::allreduce(o);
        } else if (a.op == "reduce") {
          gloo::ReduceOptions o(context);
          o.setOutput(send.data(), count);
          o.setRoot(0);
          o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
          o.setTag(tag++);
          gloo::reduce(o);
        } else if (a.op == "broadcast") {
          gloo::BroadcastOptions o(context);
          o.setOutput(send.data(), count);
          o.setRoot(0);
          o.setTag(tag++);
          gloo::broadcast(o);
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
      return std::pair{drun::bench::timeIt(a, runOnce, barrier, maxOf), 0L};
    });
    barrier();
    if (r == 0) std::filesystem::remove_all(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "drun-comm-bench-gloo: %s\n", e.what());
    return 1;
  }
}

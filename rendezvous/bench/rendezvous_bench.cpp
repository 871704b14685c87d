// rendezvous_bench: N agents join one round of MIN=MAX=N against drun's store server; measures
// the time until every agent has its rank. Driven by
// scripts/bench/rendezvous.sh, which prints it beside torch's c10d rendezvous.
//
//   rendezvous_bench [--port P] [--host H] [--sizes 64,256,1024,4096] [--mode generator|real]
//
// --mode generator (default): one thread, one Asio io_context, N connections; each agent is a
//   coroutine speaking the wire protocol (protocol.hpp) and issuing exactly the store calls of
//   C10dRendezvous::next() for a fresh job (ExitBarrier::enter, checkJobConfig, startRound,
//   RoundJoin, RoundCloser::tryClose for the last arrival), in the same order and the same
//   batches (StoreBatch: one Batch frame, as TcpStore::runBatch sends them)
//   (keys, values, will and the closer's decision come from keys.hpp / decideRound, shared with
//   the rendezvous). Thousands of agents cost no threads.
// --mode real: N threads, each a real C10dRendezvous over its own TcpStore (cross-check of the
//   generator for small N; each agent has a heartbeat thread and later a watcher connection).
// Without --port the server runs in this process (StoreServer on its own io thread).
// Timing starts when every agent is connected and all start together; connecting is reported
// apart. rank_ms: every agent has its node rank, rank offset and master; next_ms: every agent
// also has the hosts list (= next() would return).
// --hosts-always 1: every agent also reads the hosts list whatever N (what next() did before
//   kMaxHostsInResult: the "before" rows of docs/benchmarks/rendezvous.md).
// --sequential 1: every call waits for the answer to the one before (next() before StoreBatch:
//   9 round trips per agent instead of 5; the "before" rows of the batch table in
//   docs/benchmarks/rendezvous.md).
// --server-pid P: also report the daemon's CPU time for the round (from /proc; the wall time
//   depends on what else the machine runs, the CPU time much less).
// Output: one "RESULT drun <mode> <N> <connect_ms> <rank_ms> <next_ms> <calls> <bytes> <server_cpu_ms>
// <client_cpu_ms>" (client: this process, the generator)
// per size
// (calls, bytes: store calls of all agents and their frames both ways, generator mode only;
// the handshakes are not counted).
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>

#include <algorithm>
#include <utility>

#include <boost/asio.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "drun/common/deadline.hpp"
#include "drun/common/error.hpp"
#include "drun/rendezvous/c10d_rendezvous.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/store/protocol.hpp"
#include "drun/store/store_server.hpp"
#include "drun/store/tcp_store.hpp"
#include "process_cpu.hpp"
#include "rendezvous_agent.hpp"

namespace asio = boost::asio;
using asio::ip::tcp;
using namespace drun;
using namespace drun::rdzv;
using namespace std::chrono_literals;
using namespace drun::rdzv::bench;

namespace {

constexpr size_t kConnectConcurrency = 128;  // stays under the listen backlog

using drun::bench::cpuMs;

struct Result {
  double connectMs = 0, rankMs = 0, doneMs = 0;
  uint64_t calls = 0;
  uint64_t bytes = 0;
  double serverCpuMs = 0;  // the daemon's CPU time from all-connected to every agent done
  double clientCpuMs = 0;  // this process' (the generator's) over the same span
};

Result runGenerator(const std::string& host, uint16_t port, int n, const std::string& runId,
                    int serverPid) {
  asio::io_context io(1);
  std::vector<std::unique_ptr<Agent>> agents;
  for (int i = 0; i < n; ++i) {
    auto a = std::make_unique<Agent>(io);
    a->self.id = "a" + std::to_string(i);
    a->self.host = "node" + std::to_string(i);
    a->self.addr = "10.0." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1);
    a->self.localWorldSize = 8;
    a->self.masterPort = static_cast<uint16_t>(20000 + i);
    agents.push_back(std::move(a));
  }
  std::exception_ptr failure;
  auto onDone = [&](std::exception_ptr e) {
    if (e && !failure) failure = e;
  };
  const tcp::endpoint endpoint(asio::ip::make_address(host), port);

  // Connect with bounded concurrency (a burst of SYNs over the backlog costs 1 s retries).
  const auto t0 = Clock::now();
  size_t nextToConnect = 0;
  for (size_t w = 0; w < std::min<size_t>(kConnectConcurrency, agents.size()); ++w)
    asio::co_spawn(io, [&]() -> asio::awaitable<void> {
      while (nextToConnect < agents.size()) {
        Agent& a = *agents[nextToConnect++];
        co_await a.socket.async_connect(endpoint, asio::use_awaitable);
        a.socket.set_option(tcp::no_delay(true));
        co_await handshake(a);
      }
    }, onDone);
  io.run();
  if (failure) std::rethrow_exception(failure);
  const auto t1 = Clock::now();

  io.restart();
  const double cpu0 = cpuMs(serverPid);
  const double self0 = cpuMs(::getpid());
  for (auto& a : agents) asio::co_spawn(io, join(*a, runId, n), onDone);
  io.run();
  if (failure) std::rethrow_exception(failure);

  Result r;
  r.serverCpuMs = cpuMs(serverPid) - cpu0;
  r.clientCpuMs = cpuMs(::getpid()) - self0;
  r.connectMs = msSince(t0, t1);
  std::vector<bool> seen(n);
  for (auto& a : agents) {
    r.rankMs = std::max(r.rankMs, msSince(t1, a->rankAt));
    r.doneMs = std::max(r.doneMs, msSince(t1, a->doneAt));
    r.calls += a->calls;
    r.bytes += a->bytes;
    if (a->nodeRank < 0 || a->nodeRank >= n || seen[a->nodeRank])
      throw Error("bad node rank " + std::to_string(a->nodeRank));
    seen[a->nodeRank] = true;
  }
  // Clean up the job's keys so that the next size starts from a small store.
  io.restart();
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    co_await call(*agents[0], request(wire::Op::DeletePrefix, keys::job(runId)));
  }, onDone);
  io.run();
  return r;
}

Result runReal(const std::string& host, uint16_t port, int n, const std::string& runId) {
  RendezvousOptions o;
  o.runId = runId;
  o.minNodes = o.maxNodes = n;
  o.localWorldSize = 8;
  o.joinTimeout = 120s;
  TcpStoreOptions client;
  client.endpoint = {host, port};
  client.connectTimeout = 30s;
  const auto t0 = Clock::now();
  std::vector<std::unique_ptr<Rendezvous>> agents;
  for (int i = 0; i < n; ++i) {
    C10dStoreAccess access;
    access.store = std::make_unique<TcpStore>(client);
    access.selfAddress = "127.0.0.1";
    auto options = o;
    options.localAddr = "node" + std::to_string(i);
    agents.push_back(makeC10dRendezvous(options, std::move(access)));
  }
  const auto t1 = Clock::now();
  std::vector<Clock::time_point> done(n);
  std::vector<int> ranks(n, -1);
  std::latch start(n + 1);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      ranks[i] = agents[i]->next().nodeRank;
      done[i] = Clock::now();
    });
  const auto t2 = Clock::now();
  start.arrive_and_wait();
  for (auto& t : threads) t.join();
  Result r;
  r.connectMs = msSince(t0, t1);
  for (auto& d : done) r.rankMs = std::max(r.rankMs, msSince(t2, d));
  r.doneMs = r.rankMs;  // next() returns with both
  for (auto& a : agents) a->leave();
  return r;
}

void raiseFileLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

int usage() {
  std::cerr << "usage: rendezvous_bench [--host H] [--port P] [--sizes 64,256,...] "
               "[--mode generator|real]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1", mode = "generator";
  int port = -1;
  int serverPid = 0;
  std::vector<int> sizes = {64, 256, 1024, 4096};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (i + 1 >= argc) return usage();
    std::string value = argv[++i];
    if (arg == "--host") {
      host = value;
    } else if (arg == "--hosts-always") {
      gHostsAlways = value == "1";
    } else if (arg == "--sequential") {
      gSequential = value == "1";
    } else if (arg == "--server-pid") {
      serverPid = std::atoi(value.c_str());
    } else if (arg == "--port") {
      port = std::atoi(value.c_str());
    } else if (arg == "--mode" && (value == "generator" || value == "real")) {
      mode = value;
    } else if (arg == "--sizes") {
      sizes.clear();
      for (size_t p = 0; p < value.size();) {
        size_t comma = value.find(',', p);
        if (comma == std::string::npos) comma = value.size();
        int n = std::atoi(value.substr(p, comma - p).c_str());
        if (n < 1) return usage();
        sizes.push_back(n);
        p = comma + 1;
      }
    } else {
      return usage();
    }
  }
  raiseFileLimit();
  std::unique_ptr<StoreServer> server;
  if (port < 0) {
    StoreServerOptions so;
    so.listen = {host, 0};
    server = std::make_unique<StoreServer>(so);
    server->start();
    port = server->port();
  }
  try {
    int run = 0;
    for (int n : sizes) {
      const std::string runId = "bench-" + std::to_string(::getpid()) + "-" + std::to_string(run++);
      Result r = mode == "real" ? runReal(host, static_cast<uint16_t>(port), n, runId)
                                : runGenerator(host, static_cast<uint16_t>(port), n, runId,
                                               serverPid);
      std::printf("RESULT drun %s %d %.1f %.1f %.1f %llu %llu %.0f %.0f\n", mode.c_str(), n,
                  r.connectMs, r.rankMs, r.doneMs, static_cast<unsigned long long>(r.calls),
                  static_cast<unsigned long long>(r.bytes), r.serverCpuMs, r.clientCpuMs);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rendezvous_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}

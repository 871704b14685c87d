// etcd_rendezvous_bench: N agents join one round of MIN=MAX=N on the etcd backend; measures the
// time until every agent's next() returned. Each agent is a thread running the real
// C10dRendezvous on its own EtcdStore and EtcdSession (its own lease, keep-alive and will
// executor), as N drun processes would. Driven by scripts/bench/rendezvous.sh (the etcd column).
//
//   etcd_rendezvous_bench --endpoints h1:2379,h2:2379,h3:2379 [--sizes 8,64,1024]
//
// Timing starts when every agent has its session (lease granted: reported apart as connect).
// Output: one "RESULT etcd real <N> <connect_ms> <next_ms>" per size ("... error <why>" on failure).
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <latch>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "drun/common/deadline.hpp"
#include "drun/common/error.hpp"
#include "drun/rendezvous/c10d_rendezvous.hpp"
#include "drun/rendezvous/etcd_store.hpp"
#include "drun/rendezvous/store_server.hpp"

using namespace drun;
using namespace drun::rdzv;
using namespace std::chrono_literals;

namespace {

double msSince(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

std::vector<int> parseSizes(const std::string& text) {
  std::vector<int> sizes;
  size_t start = 0;
  while (start < text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    sizes.push_back(std::stoi(text.substr(start, comma - start)));
    start = comma + 1;
  }
  return sizes;
}

void runSize(const std::vector<std::string>& endpoints, int n) {
  std::random_device rd;
  const std::string runId = "bench" + std::to_string(n) + "x" + std::to_string(rd() % 100000);
  EtcdStoreOptions storeOptions;
  storeOptions.client.endpoints = endpoints;
  storeOptions.client.callTimeout = 60s;
  storeOptions.client.attemptTimeout = 20s;
  storeOptions.prefix = "/drun-bench/";
  storeOptions.scope = runId;
  storeOptions.leaseTtl = 30s;  // a loaded machine: no agent taken for dead during the round
  storeOptions.connectTimeout = 60s;

  RendezvousOptions options;
  options.runId = runId;
  options.minNodes = options.maxNodes = n;
  options.joinTimeout = 240s;
  options.lastCallTimeout = 1s;
  options.heartbeatTimeout = storeOptions.leaseTtl;
  options.readTimeout = 60s;

  std::latch sessionsReady(n), go(1), done(n);
  std::mutex mutex;
  std::string failure;
  std::vector<Clock::time_point> finished(n);
  std::vector<std::unique_ptr<Rendezvous>> agents(n);
  const auto connectStart = Clock::now();
  Clock::time_point start;
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      std::shared_ptr<EtcdSession> session;
      try {
        session = openEtcdSession(storeOptions);
        C10dStoreAccess access;
        access.store = std::make_unique<EtcdStore>(session);
        access.connectWatcher = [session] { return std::make_unique<EtcdStore>(session); };
        access.endpoint = "etcd";
        access.selfAddress = "127.0.0.1";
        RendezvousOptions mine = options;
        mine.localAddr = "127.0.0.1";
        agents[i] = makeC10dRendezvous(mine, std::move(access));
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex);
        failure = e.what();
      }
      sessionsReady.count_down();
      go.wait();
      try {
        if (agents[i]) agents[i]->next();
        finished[i] = Clock::now();
      } catch (const std::exception& e) {
        std::lock_guard lock(mutex);
        failure = e.what();
      }
      done.count_down();
    });
  }
  sessionsReady.wait();
  const double connectMs = msSince(connectStart, Clock::now());
  start = Clock::now();
  go.count_down();
  done.wait();
  Clock::time_point last = start;
  for (const auto& t : finished) last = std::max(last, t);
  // Leave in parallel, as separate processes would.
  std::vector<std::thread> leavers;
  for (int i = 0; i < n; ++i)
    leavers.emplace_back([&, i] {
      try {
        if (agents[i]) agents[i]->leave();
        agents[i].reset();
      } catch (...) {
      }
    });
  for (auto& t : leavers) t.join();
  for (auto& t : threads) t.join();
  if (!failure.empty()) {
    std::printf("RESULT etcd real %d error %s\n", n, failure.substr(0, 200).c_str());
  } else {
    std::printf("RESULT etcd real %d %.1f %.1f\n", n, connectMs, msSince(start, last));
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string endpointList, sizes = "8,64,256,1024";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--endpoints")) endpointList = argv[i + 1];
    else if (!std::strcmp(argv[i], "--sizes")) sizes = argv[i + 1];
  }
  if (endpointList.empty()) {
    std::fprintf(stderr, "usage: etcd_rendezvous_bench --endpoints h1:2379,... [--sizes 8,64]\n");
    return 2;
  }
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
  spdlog::set_level(spdlog::level::warn);
  try {
    const auto endpoints = parseEtcdEndpoints(endpointList);
    for (int n : parseSizes(sizes)) runSize(endpoints, n);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "etcd_rendezvous_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}

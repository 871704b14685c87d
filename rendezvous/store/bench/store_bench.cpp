// store_bench: ops/s and p50/p99 latency of set, get, add and compareSet against a drun store
// server, with N client connections (one thread and one TcpStore each), run by
// scripts/bench/store.sh beside the same mix against torch's TCPStore.
//
//   store_bench [--host H] [--port P] [--clients N] [--ops K]
//
// --port 0 (default) serves from an in-process StoreServer on its own io thread. Each client
// does K calls of each op on its own key; all clients start together (latch) and the wall time
// runs from the start to the last client's last call. Prints one line per op:
//   RESULT drun <op> <clients> <ops_per_s> <p50_us> <p99_us>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "drun/common/error.hpp"
#include "drun/store/store_server.hpp"
#include "drun/store/tcp_store.hpp"

using namespace drun::rdzv;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  int clients = 1;
  int ops = 2000;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "store_bench: %s needs a value\n", flag.c_str());
      std::exit(2);
    }
    std::string value = argv[++i];
    if (flag == "--host") a.host = value;
    else if (flag == "--port") a.port = static_cast<uint16_t>(std::stoi(value));
    else if (flag == "--clients") a.clients = std::max(1, std::stoi(value));
    else if (flag == "--ops") a.ops = std::max(1, std::stoi(value));
    else {
      std::fprintf(stderr, "store_bench: unknown option %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return a;
}

using Op = std::function<void(Store&, const std::string& key, int i)>;

struct Result {
  double opsPerSecond = 0;
  double p50us = 0;
  double p99us = 0;
};

Result runOp(const Args& args, std::vector<std::unique_ptr<TcpStore>>& stores, const Op& op,
             const std::string& name) {
  std::vector<std::vector<double>> latencies(args.clients);
  std::vector<Clock::time_point> finished(args.clients);
  std::latch ready(args.clients + 1);
  Clock::time_point start;
  std::vector<std::thread> threads;
  for (int c = 0; c < args.clients; ++c) {
    threads.emplace_back([&, c] {
      std::string key = "bench/" + name + "/" + std::to_string(c);
      auto& lat = latencies[c];
      lat.reserve(args.ops);
      ready.arrive_and_wait();
      for (int i = 0; i < args.ops; ++i) {
        auto t0 = Clock::now();
        op(*stores[c], key, i);
        lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
      finished[c] = Clock::now();
    });
  }
  start = Clock::now();
  ready.arrive_and_wait();
  for (auto& t : threads) t.join();
  auto end = *std::max_element(finished.begin(), finished.end());
  std::vector<double> all;
  for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  Result r;
  double seconds = std::chrono::duration<double>(end - start).count();
  r.opsPerSecond = static_cast<double>(all.size()) / seconds;
  r.p50us = all[all.size() / 2];
  r.p99us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  try {
    std::unique_ptr<StoreServer> server;
    if (args.port == 0) {
      StoreServerOptions so;
      so.listen = {args.host, 0};
      server = std::make_unique<StoreServer>(so);
      server->start();
      args.port = server->port();
    }
    std::vector<std::unique_ptr<TcpStore>> stores;
    for (int c = 0; c < args.clients; ++c) {
      TcpStoreOptions o;
      o.endpoint = {args.host, args.port};
      o.connectTimeout = std::chrono::seconds(10);
      o.timeout = std::chrono::seconds(30);
      stores.push_back(std::make_unique<TcpStore>(o));
    }
    const std::string value(64, 'v');
    std::vector<std::pair<std::string, Op>> ops = {
        {"set", [&](Store& s, const std::string& k, int) { s.set(k, value); }},
        {"get", [&](Store& s, const std::string& k, int i) {
           if (i == 0) s.set(k, value);
           s.get(k, std::chrono::seconds(30));
         }},
        {"add", [](Store& s, const std::string& k, int) { s.add(k, 1); }},
        // Succeeds every time: expected is what the previous call stored.
        {"compare_set", [](Store& s, const std::string& k, int i) {
           s.compareSet(k, i == 0 ? std::string() : std::to_string(i - 1), std::to_string(i));
         }},
    };
    for (auto& [name, op] : ops) {
      // The first call of get (the set) is inside the timed loop; one call in thousands.
      Result r = runOp(args, stores, op, name);
      std::printf("RESULT drun %s %d %.0f %.1f %.1f\n", name.c_str(), args.clients, r.opsPerSecond,
                  r.p50us, r.p99us);
      std::fflush(stdout);
    }
    stores.clear();
    if (server) server->stop();
  } catch (const drun::Error& e) {
    std::fprintf(stderr, "store_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}

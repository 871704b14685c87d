// etcd_rendezvous_bench: N agents join one round of MIN=MAX=N on the etcd backend; measures the
// time until every agent's next() returned. Each agent is a thread running the real
// C10dRendezvous on its own EtcdStore and EtcdSession (its own lease, keep-alive and will
// executor), as N drun processes would. The agents are spread over processes of at most
// --per-process agents each (an agent holds about 20 descriptors: its clients' sockets and
// I/O contexts; one process could not hold 1024 under a 20,000 limit). Driven by
// scripts/bench/rendezvous.sh (the etcd column).
//
//   etcd_rendezvous_bench --endpoints h1:2379,h2:2379,h3:2379 [--sizes 8,64,1024] [--cap 240]
//                         [--per-process 512] [--member-pids P1,P2,P3]
//
// Timing starts when every agent of every process has its session (lease granted: reported
// apart as connect) and ends when the last next() returned (steady_clock is CLOCK_MONOTONIC, one
// clock for all processes). Output: one "RESULT etcd real <N> <connect_ms> <next_ms>" per size
// ("... error <why>" on failure); progress on stderr. Then what the round cost, between "go" and
// the last next(): "COST etcd <N> agents_cpu_ms=<C> members_cpu_ms=<M> <requests by kind>"
// (etcd_call_counts.hpp; the sessions' opening not included; members' CPU with --member-pids,
// the etcd processes' pids, comma-separated).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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
#include "drun/etcd/etcd_call_counts.hpp"
#include "drun/etcd/etcd_store.hpp"
#include "drun/store/store_server.hpp"  // C10dStoreAccess holds one
#include "process_cpu.hpp"

using namespace drun;
using namespace drun::rdzv;
using namespace std::chrono_literals;

namespace {

struct Plan {
  std::vector<std::string> endpoints;
  int n = 0;
  std::string runId;
  std::chrono::seconds cap{240};
  std::vector<int> memberPids;  // etcd's processes, whose CPU the round costs
};

double membersCpuMs(const std::vector<int>& pids) {
  double total = 0;
  for (int pid : pids) total += bench::cpuMs(pid);
  return total;
}

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

// One line to or from a process of agents (pipes: short lines, written at once).
void sendLine(int fd, const std::string& line) {
  const std::string text = line + "\n";
  if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) std::_Exit(3);
}
std::string readLine(int fd) {
  std::string line;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') line += c;
  return line;
}

// Runs `count` agents of the round in this process: reports "ready" once their sessions are
// open, starts at the parent's "go", reports "<last finish in ns> <failures> <first failure>",
// and at the parent's "leave" (every process done) leaves the round, in parallel.
void runAgents(const Plan& plan, int count, int toParent, int fromParent) {
  EtcdStoreOptions storeOptions;
  storeOptions.client.endpoints = plan.endpoints;
  storeOptions.client.callTimeout = 60s;
  storeOptions.client.attemptTimeout = 20s;
  storeOptions.prefix = "/drun-bench/";
  storeOptions.scope = plan.runId;
  storeOptions.leaseTtl = 30s;  // a loaded machine: no agent taken for dead during the round
  storeOptions.connectTimeout = 60s;

  RendezvousOptions options;
  options.runId = plan.runId;
  options.minNodes = options.maxNodes = plan.n;
  options.joinTimeout = plan.cap;
  options.lastCallTimeout = 1s;
  options.heartbeatTimeout = storeOptions.leaseTtl;
  options.readTimeout = 60s;
  options.localAddr = "127.0.0.1";
  storeOptions.jobLeaseTtl = options.etcdHistoryTtl;  // as drun's agents (etcd_factory.cpp)

  std::latch sessionsReady(count), go(1), done(count);
  std::mutex mutex;
  std::string failure;  // the first: later ones are often its consequences (a round timed out)
  int failures = 0;
  auto fail = [&](const std::string& why) {
    std::lock_guard lock(mutex);
    if (failures++ == 0) failure = why;
  };
  std::vector<Clock::time_point> finished(count);
  std::vector<std::unique_ptr<Rendezvous>> agents(count);
  std::vector<std::thread> threads;
  for (int i = 0; i < count; ++i) {
    threads.emplace_back([&, i] {
      try {
        auto session = openEtcdSession(storeOptions);
        C10dStoreAccess access;
        access.store = std::make_unique<EtcdStore>(session);
        access.connectWatcher = [session] { return std::make_unique<EtcdStore>(session); };
        access.endpoint = "etcd";
        access.selfAddress = "127.0.0.1";
        agents[i] = makeC10dRendezvous(options, std::move(access));
      } catch (const std::exception& e) {
        fail(std::string("session: ") + e.what());
      }
      sessionsReady.count_down();
      go.wait();
      try {
        if (agents[i]) agents[i]->next();
      } catch (const std::exception& e) {
        fail(std::string("next(): ") + e.what());
      }
      finished[i] = Clock::now();
      done.count_down();
    });
  }
  sessionsReady.wait();
  sendLine(toParent, "ready");
  if (readLine(fromParent) != "go") std::_Exit(4);
  const EtcdCallCounts countsAtGo = etcdCallCounts();
  const double cpuAtGo = bench::cpuMs(::getpid());
  go.count_down();
  done.wait();
  const double cpuMs = bench::cpuMs(::getpid()) - cpuAtGo;
  EtcdCallCounts counts = etcdCallCounts();
  counts -= countsAtGo;
  Clock::time_point last{};
  for (const auto& t : finished) last = std::max(last, t);
  std::string first = failure.substr(0, 300);
  std::replace(first.begin(), first.end(), '\n', ' ');
  std::replace(first.begin(), first.end(), ';', ',');
  sendLine(toParent, std::to_string(last.time_since_epoch().count()) + " " + std::to_string(failures) + " " +
                         std::to_string(cpuMs) + " " + counts.format() + ";" + first);
  // Agents that leave while others still wait would load etcd in the round being timed.
  if (readLine(fromParent) != "leave") std::_Exit(4);
  std::vector<std::thread> leavers;
  for (int i = 0; i < count; ++i)
    leavers.emplace_back([&, i] {
      try {
        if (agents[i]) agents[i]->leave();
        agents[i].reset();
      } catch (...) {
      }
    });
  for (auto& t : leavers) t.join();
  for (auto& t : threads) t.join();
}

void runSize(Plan plan, int perProcess) {
  std::random_device rd;
  plan.runId = "bench" + std::to_string(plan.n) + "x" + std::to_string(rd() % 100000);
  const int processes = (plan.n + perProcess - 1) / perProcess;
  struct Child {
    pid_t pid;
    int toChild, fromChild;
  };
  std::vector<Child> children;
  const auto connectStart = Clock::now();
  for (int p = 0; p < processes; ++p) {
    int down[2], up[2];
    if (::pipe(down) != 0 || ::pipe(up) != 0) throw Error("pipe failed");
    const int count = plan.n / processes + (p < plan.n % processes ? 1 : 0);
    const pid_t pid = ::fork();
    if (pid < 0) throw Error("fork failed");
    if (pid == 0) {  // no thread runs in the parent between sizes: fork is safe here
      ::close(down[1]);
      ::close(up[0]);
      runAgents(plan, count, up[1], down[0]);
      std::fflush(nullptr);
      std::_Exit(0);
    }
    ::close(down[0]);
    ::close(up[1]);
    children.push_back({pid, down[1], up[0]});
  }
  bool ready = true;
  for (const Child& c : children) ready = readLine(c.fromChild) == "ready" && ready;
  const double connectMs = msSince(connectStart, Clock::now());
  std::fprintf(stderr, "etcd_rendezvous_bench: %d sessions in %d process(es) in %.0f ms\n", plan.n,
               processes, connectMs);
  const double membersAtGo = membersCpuMs(plan.memberPids);
  const auto start = Clock::now();
  for (const Child& c : children) sendLine(c.toChild, "go");
  Clock::time_point last = start;
  int failures = ready ? 0 : 1;
  std::string failure = ready ? "" : "a process of agents did not start";
  EtcdCallCounts counts;
  double agentsCpuMs = 0;
  for (const Child& c : children) {
    const std::string line = readLine(c.fromChild);
    long long finishedNs = 0;
    int failed = 0, used = 0;
    double cpuMs = 0;
    const size_t semicolon = line.find(';');
    if (semicolon == std::string::npos ||
        std::sscanf(line.c_str(), "%lld %d %lf %n", &finishedNs, &failed, &cpuMs, &used) < 3) {
      ++failures;
      failure = failure.empty() ? "a process of agents ended without a result" : failure;
      continue;
    }
    last = std::max(last, Clock::time_point(Clock::duration(finishedNs)));
    if (failed && failure.empty()) failure = line.substr(semicolon + 1);
    failures += failed;
    agentsCpuMs += cpuMs;
    counts += EtcdCallCounts::parse(std::string_view(line).substr(used, semicolon - used));
  }
  const double membersMs = membersCpuMs(plan.memberPids) - membersAtGo;
  std::fprintf(stderr, "etcd_rendezvous_bench: every next() returned after %.0f ms\n", msSince(start, last));
  for (const Child& c : children) sendLine(c.toChild, "leave");
  for (const Child& c : children) {
    ::close(c.toChild);
    ::close(c.fromChild);
    int status = 0;
    ::waitpid(c.pid, &status, 0);
  }
  if (failures) {
    std::printf("RESULT etcd real %d error %d agent(s) failed; first: %s\n", plan.n, failures,
                failure.substr(0, 300).c_str());
  } else {
    std::printf("RESULT etcd real %d %.1f %.1f\n", plan.n, connectMs, msSince(start, last));
  }
  std::printf("COST etcd %d agents_cpu_ms=%.0f members_cpu_ms=%.0f %s\n", plan.n, agentsCpuMs, membersMs,
              counts.format().c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string endpointList, sizes = "8,64,256,1024";
  std::chrono::seconds cap = 240s;  // a round not formed by then fails (the join timeout)
  int perProcess = 512;
  std::vector<int> memberPids;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--endpoints")) endpointList = argv[i + 1];
    else if (!std::strcmp(argv[i], "--sizes")) sizes = argv[i + 1];
    else if (!std::strcmp(argv[i], "--cap")) cap = std::chrono::seconds(std::stoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--per-process")) perProcess = std::max(1, std::stoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--member-pids")) memberPids = parseSizes(argv[i + 1]);
  }
  if (endpointList.empty()) {
    std::fprintf(stderr, "usage: etcd_rendezvous_bench --endpoints h1:2379,... [--sizes 8,64] [--cap S] [--per-process K] [--member-pids P1,P2,P3]\n");
    return 2;
  }
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
  spdlog::set_level(spdlog::level::warn);
  try {
    Plan plan;
    plan.endpoints = parseEtcdEndpoints(endpointList);
    plan.cap = cap;
    plan.memberPids = memberPids;
    for (int n : parseSizes(sizes)) {
      plan.n = n;
      runSize(plan, perProcess);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "etcd_rendezvous_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}

// recovery_worker: plays the worker's side of an in-process recovery (docs/recovery.md) over the
// workers' store, without libdrun_comm: it takes part in every generation that begins (sets
// recovery/<g>/joined/<rank>, adds to recovery/<g>/formed, the rank that completes it sets the
// outcome "formed"; a generation superseded before its outcome is left for the newest; a
// shrink's or a grow's recovery/<g>/world renumbers its rank and world size) and runs its steps
// meanwhile. Its store connection lost between steps (a restarted rendezvous daemon), it
// connects again.
// For the launcher's recovery tests.
//
//   recovery_worker [--steps N] [--step-ms MS] [--die RANK:STEP] [--never-join]
//     --die RANK:STEP   rank RANK exits 3 at step STEP, in generation 0 of restart count 0 only
//                       (its replacement and a restarted job run to the end)
//     --never-join      survivors never take part in a recovery (a program that does not use the
//                       API); a replacement still joins the generation it was started in
//
// Prints "RW start rank=R local=L pid=P gen=G restart=C", "RW formed rank=R gen=G",
// "RW shrunk rank=R was=Q world=W gen=G", "RW grown rank=R was=R world=W gen=G", "RW done rank=R pid=P world=W" (one write(2) per line). Without DRUN_WORKER_STORE (--recovery
// restart) it only runs its steps. Every wait is bounded (30 s); dies by SIGALRM after 180 s.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "drun/common/error.hpp"
#include "drun/common/host_port.hpp"
#include "drun/rendezvous/recovery_keys.hpp"
#include "drun/store/tcp_store.hpp"
#include "drun/store/token_file.hpp"

namespace {

namespace keys = drun::rdzv::recovery;
using namespace std::chrono_literals;

void say(const std::string& line) {
  std::string out = line + "\n";
  [[maybe_unused]] ssize_t n = ::write(1, out.data(), out.size());
}

std::string env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

struct Args {
  int steps = 50;
  int stepMs = 20;
  int dieRank = -1;
  int dieStep = -1;
  bool neverJoin = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (arg == "--steps") a.steps = std::stoi(next());
    else if (arg == "--step-ms") a.stepMs = std::stoi(next());
    else if (arg == "--die") {
      std::string v = next();
      a.dieRank = std::stoi(v.substr(0, v.find(':')));
      a.dieStep = std::stoi(v.substr(v.find(':') + 1));
    } else if (arg == "--never-join") a.neverJoin = true;
    else {
      std::fprintf(stderr, "recovery_worker: unknown argument %s\n", arg.c_str());
      std::exit(97);
    }
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  ::alarm(180);
  const Args args = parse(argc, argv);
  int rank = std::stoi(env("RANK", "0")), world = std::stoi(env("WORLD_SIZE", "1"));
  const int restart = std::stoi(env("TORCHELASTIC_RESTART_COUNT", "0"));
  uint64_t generation = std::stoull(env("DRUN_GENERATION", "0"));
  const std::string prefix = env("DRUN_WORKER_STORE_PREFIX");
  say("RW start rank=" + std::to_string(rank) + " local=" + env("LOCAL_RANK") + " pid=" +
      std::to_string(::getpid()) + " gen=" + std::to_string(generation) + " restart=" + std::to_string(restart) +
      " recovery=" + env("DRUN_RECOVERY", "-"));

  std::unique_ptr<drun::rdzv::TcpStore> store;
  drun::rdzv::TcpStoreOptions storeOptions;
  if (!env("DRUN_WORKER_STORE").empty()) {
    storeOptions.endpoint = drun::HostPort::parse(env("DRUN_WORKER_STORE"), {"DRUN_WORKER_STORE"});
    storeOptions.connectTimeout = 30s;
    storeOptions.timeout = 30s;
    storeOptions.scope = env("TORCHELASTIC_RUN_ID");
    if (!env("DRUN_RDZV_TOKEN_FILE").empty())
      storeOptions.token = drun::rdzv::readTokenFile(env("DRUN_RDZV_TOKEN_FILE"), "token");
    store = std::make_unique<drun::rdzv::TcpStore>(storeOptions);
  }
  // The generation now; a lost connection (the store restarted) is made again and read once
  // more, for at most 30 s (a connection made while the old server was dying is lost too).
  auto currentGeneration = [&] {
    const auto until = std::chrono::steady_clock::now() + 30s;
    for (;;) {
      try {
        if (!store) store = std::make_unique<drun::rdzv::TcpStore>(storeOptions);
        return keys::parseGeneration(store->tryGet(keys::generation(prefix)));
      } catch (const drun::NetworkError& e) {
        if (std::chrono::steady_clock::now() > until) throw;
        say("RW reconnecting rank=" + std::to_string(rank));
        store.reset();
        std::this_thread::sleep_for(100ms);
      }
    }
  };
  // The shrinks and grows in (from, to] renumber this rank and the world; false when one dropped it.
  auto renumber = [&](uint64_t from, uint64_t to) {
    for (uint64_t g = from + 1; g <= to; ++g) {
      const auto record = store->tryGet(keys::world(prefix, g));
      if (!record) continue;
      const keys::World kept = keys::parseWorld(*record);
      const int now = kept.renumber(rank);
      if (now < 0) return false;
      say("RW " + std::string(kept.grows() ? "grown" : "shrunk") + " rank=" + std::to_string(now) + " was=" +
          std::to_string(rank) + " world=" + std::to_string(kept.size()) + " gen=" + std::to_string(g));
      rank = now;
      world = kept.size();
    }
    return true;
  };
  // Takes part in generation g: joined, formed; the rank that completes it sets the outcome. A
  // generation that begins before g's outcome supersedes it: this rank takes part in that one.
  auto join = [&](uint64_t g) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    for (uint64_t from = generation;;) {
      if (!renumber(from, g)) {
        say("RW dropped rank=" + std::to_string(rank) + " gen=" + std::to_string(g));
        std::exit(4);
      }
      store->set(keys::joined(prefix, g, rank), std::string(host) + " pid " + std::to_string(::getpid()));
      if (store->add(keys::formed(prefix, g), 1) == world) store->compareSet(keys::outcome(prefix, g), "", "formed");
      const auto until = std::chrono::steady_clock::now() + 30s;
      std::optional<std::string> outcome;
      uint64_t newest = g;
      while (!outcome && newest == g && std::chrono::steady_clock::now() < until) {
        outcome = store->tryGet(keys::outcome(prefix, g));
        newest = keys::parseGeneration(store->tryGet(keys::generation(prefix)));
        if (!outcome && newest == g) std::this_thread::sleep_for(10ms);
      }
      if (!outcome && newest > g) {
        from = g;
        g = newest;
        continue;
      }
      say("RW " + std::string(outcome == std::optional<std::string>("formed") ? "formed" : "fallback") +
          " rank=" + std::to_string(rank) + " gen=" + std::to_string(g));
      generation = g;
      return;
    }
  };
  if (store && generation > 0) join(generation);
  const bool original = generation == 0 && restart == 0;
  for (int step = 0; step < args.steps; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(args.stepMs));
    if (original && rank == args.dieRank && step == args.dieStep) {
      say("RW dying rank=" + std::to_string(rank) + " step=" + std::to_string(step));
      return 3;
    }
    if (!store || args.neverJoin) continue;
    const uint64_t current = currentGeneration();
    if (current > generation) join(current);
  }
  say("RW done rank=" + std::to_string(rank) + " pid=" + std::to_string(::getpid()) + " world=" +
      std::to_string(world));
  return 0;
}

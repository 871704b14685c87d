// In-process tests of failures: a rank that never comes, a receive nobody answers, what abort()
// does to pending Gloo requests, mismatched collectives under DRUN_COMM_CHECK (true, and the
// default sampled check).
#include <catch2/catch.hpp>
#include <type_traits>

#include "drun/store/prefix_store.hpp"

#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <latch>
#include <thread>

#include "drun/comm.h"
#include "drun/comm/communicator.hpp"
#include "drun/rendezvous/port_reservation.hpp"
#include "drun/store/memory_store.hpp"
#include "reduce.hpp"
#include "hier/hier_backend.hpp"
#include "shm/shm_copy.hpp"
#include "shm/shm_segment.hpp"
#include "comm_unit_support.hpp"
#include "thread_checks.hpp"

using namespace drun::comm;
using namespace drun::test;
using namespace std::chrono_literals;

TEST_CASE("comm: a rank that does not come fails the others within the timeout, then for good", "[comm]") {
  std::latch released(1);
  runRanks(2, [&](int r, Communicator& world) {
    if (r == 1) {
      released.wait();  // does not take part until rank 0 has timed out
      return;
    }
    int v = 1;
    auto t0 = std::chrono::steady_clock::now();
    T_CHECK_THROWS_AS(world.allReduce(&v, 1, DType::Int32, ReduceOp::Sum, 300ms), drun::TimeoutError);
    auto waited = std::chrono::steady_clock::now() - t0;
    T_CHECK(waited >= 250ms);
    T_CHECK(waited < 5s);
    t0 = std::chrono::steady_clock::now();
    T_CHECK_THROWS_WITH(world.barrier(), Catch::Contains("unusable since"));
    T_CHECK(std::chrono::steady_clock::now() - t0 < 1s);
    released.count_down();
  });
}

TEST_CASE("comm: a receive nobody answers times out within its timeout", "[comm]") {
  std::latch released(1);
  runRanks(2, [&](int r, Communicator& world) {
    if (r == 1) {
      released.wait();
      return;
    }
    char byte = 0;
    auto t0 = std::chrono::steady_clock::now();
    T_CHECK_THROWS_AS(world.recv(&byte, 1, DType::Int8, 1, 0, 200ms), drun::TimeoutError);
    T_CHECK(std::chrono::steady_clock::now() - t0 < 3s);
    released.count_down();
  });
}

// Rank r of a Gloo backend of 2 ranks on loopback, meeting in `shared` (10 s deadlines).
std::unique_ptr<drun::comm::detail::Backend> loopbackGlooBackend(
    const std::shared_ptr<drun::rdzv::MemoryStore::Shared>& shared, int r) {
  using namespace drun::comm::detail;
  auto store = std::make_shared<drun::rdzv::MemoryStore>(shared);
  BackendConfig config;
  config.store = store;
  config.rank = r;
  config.size = 2;
  config.timeout = 10s;
  config.socketIfname = "lo";
  return makeGlooBackend(makeGlooDevice(config), store, r, 2, 10s);
}

// Gloo's device thread reads a message into the receive posted for it. A receive dropped
// unfinished (a hierarchical exchange posts its receives first, then a step of shm fails) leaves
// the message unread on a level-triggered socket, and the thread spins on it, a core, for as
// long as the connection is open. abort() (a failed communicator's) closes the connections.
TEST_CASE("comm: after abort, a message for a dropped Gloo receive costs no CPU", "[comm]") {
  using namespace drun::comm::detail;
  auto shared = drun::rdzv::MemoryStore::makeShared();
  // Each rank waits for the other's step with a deadline: a rank that failed first must not hang it.
  std::promise<void> dropped, sent;
  std::shared_future<void> droppedDone = dropped.get_future().share(), sentDone = sent.get_future().share();
  auto await = [](const std::shared_future<void>& step, const char* what) {
    if (step.wait_for(20s) != std::future_status::ready) throw std::runtime_error(std::string("the other rank never ") + what);
  };
  auto cpuSeconds = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  };
  std::vector<std::future<double>> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto backend = loopbackGlooBackend(shared, r);
      char byte = 7;
      if (r == 1) {
        await(droppedDone, "dropped its receive");
        try {  // into the receive rank 0 dropped; the closed connection may refuse it
          backend->isend(&byte, 1, 0, 0, 1s)->wait(1s);
        } catch (const drun::Error&) {
        }
        sent.set_value();
        return 0.0;
      }
      backend->irecv(&byte, 1, 1, 0, 10s).reset();  // posted, then dropped unfinished
      backend->abort();
      dropped.set_value();
      await(sentDone, "sent");
      std::this_thread::sleep_for(100ms);  // the message arrives
      const double before = cpuSeconds();
      std::this_thread::sleep_for(500ms);
      return cpuSeconds() - before;
    }));
  ranks[1].get();
  CHECK(ranks[0].get() < 0.2);  // a spinning device thread would use all 0.5 s
}

// A failed communicator (abort()) fails its own pending point-to-point requests at once: one a
// thread blocks on, one polled with test(), one never touched, and one posted afterwards. Before,
// each waited for its deadline (10 s here) although nothing could complete it any more.
TEST_CASE("comm: after abort, a rank's own pending Gloo requests fail at once, not at their deadlines", "[comm]") {
  using namespace drun::comm::detail;
  auto shared = drun::rdzv::MemoryStore::makeShared();
  std::promise<void> done;
  std::shared_future<void> rank0Done = done.get_future().share();
  drun::test::runThreads(2, [&](int r) {
    auto backend = loopbackGlooBackend(shared, r);
    if (r == 1) {  // sends nothing; stays until rank 0 is done, at most 20 s
      (void)rank0Done.wait_for(20s);
      return;
    }
    char bytes[4] = {};
    auto blocked = backend->irecv(&bytes[0], 1, 1, 0, 10s);
    auto polled = backend->irecv(&bytes[1], 1, 1, 1, 10s);
    auto untouched = backend->irecv(&bytes[2], 1, 1, 2, 10s);
    T_CHECK_FALSE(polled->test());
    auto blockedWait = std::async(std::launch::async, [&] { blocked->wait(kDefaultTimeout); });
    std::this_thread::sleep_for(200ms);  // the waiter blocks in Gloo
    const auto t0 = std::chrono::steady_clock::now();
    backend->abort();
    auto failsFast = [&](const char* what, auto&& waitFor) {
      drun::test::ThreadChecks::Note note(what);
      T_CHECK_THROWS_WITH(waitFor(), Catch::Contains("aborted"));
      T_CHECK(std::chrono::steady_clock::now() - t0 < 3s);
    };
    failsFast("blocked in Gloo", [&] { blockedWait.get(); });
    failsFast("polled", [&] { polled->wait(kDefaultTimeout); });
    failsFast("never touched", [&] { untouched->wait(kDefaultTimeout); });
    failsFast("posted after the abort", [&] { backend->irecv(&bytes[3], 1, 1, 3, 10s)->wait(kDefaultTimeout); });
    done.set_value();
  });
}

TEST_CASE("comm: with DRUN_COMM_CHECK, mismatched collectives fail on every rank by name", "[comm]") {
  for (const char* transport : kUnitTransports) {
    DYNAMIC_SECTION(transport) {
      TransportScope scope(transport);
      runRanks(2, [&](int r, Communicator& world) {
        T_CHECK(world.transport() == transport);
        std::vector<float> v(r == 0 ? 10 : 20, 1.0f);
        T_CHECK_THROWS_WITH(world.allReduce(v.data(), v.size(), DType::Float32, ReduceOp::Sum),
                          Catch::Contains("rank 0 called all_reduce of 10 float32") &&
                              Catch::Contains("rank 1 called all_reduce of 20 float32"));
        int root = r;  // disagreeing roots
        T_CHECK_THROWS_WITH(world.broadcast(v.data(), 1, DType::Float32, root), Catch::Contains("root 1"));
        world.allReduce(v.data(), 10, DType::Float32, ReduceOp::Sum);  // still usable
        T_CHECK(v[0] == 2.0f);
      }, 20s, /*check=*/true);
    }
  }
}

namespace {

// Sets (or unsets, for nullptr) an environment variable for a scope.
class EnvScope {
 public:
  EnvScope(const char* name, const char* value) : name_(name) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~EnvScope() { unsetenv(name_); }

 private:
  const char* name_;
};

}  // namespace

TEST_CASE("comm: by default, a 3-vs-4-float all_reduce and a barrier against an all_reduce fail on "
          "every rank, naming both sides", "[comm]") {
  EnvScope check("DRUN_COMM_CHECK", nullptr);  // the default: sampled
  for (const char* transport : kUnitTransports) {
    DYNAMIC_SECTION(transport) {
      TransportScope scope(transport);
      runRanks(2, [&](int r, Communicator& world) {
        std::vector<float> v(4, 1.0f);
        T_CHECK_THROWS_WITH(world.allReduce(v.data(), r == 0 ? 3 : 4, DType::Float32, ReduceOp::Sum),
                            Catch::Contains("rank 0 called all_reduce of 3 float32 sum") &&
                                Catch::Contains("rank 1 called all_reduce of 4 float32 sum"));
        auto mixed = [&] {
          if (r == 0) world.barrier();
          else world.allReduce(v.data(), 4, DType::Float32, ReduceOp::Sum);
        };
        T_CHECK_THROWS_WITH(mixed(), Catch::Contains("rank 0 called barrier") &&
                                         Catch::Contains("rank 1 called all_reduce of 4 float32 sum"));
        world.allReduce(v.data(), 4, DType::Float32, ReduceOp::Sum);  // nothing ran: still usable
        T_CHECK(v[0] == 2.0f);
      }, 20s, std::nullopt);
    }
  }
}

TEST_CASE("comm: by default, a mismatch past the first collectives is named at the next comparison, "
          "and a matched program goes on", "[comm]") {
  EnvScope check("DRUN_COMM_CHECK", nullptr);
  EnvScope interval("DRUN_COMM_CHECK_INTERVAL", "8");
  for (const char* transport : kUnitTransports) {
    DYNAMIC_SECTION(transport) {
      TransportScope scope(transport);
      runRanks(2, [&](int r, Communicator& world) {
        std::vector<float> v(4, 1.0f);
        auto sum = [&] { world.allReduce(v.data(), 4, DType::Float32, ReduceOp::Sum); };
        for (int i = 1; i <= 19; ++i) sum();  // the first 16 compared one by one, 17-19 hashed
        world.allReduce(v.data(), 4, DType::Float32, r == 0 ? ReduceOp::Sum : ReduceOp::Max);  // #20
        for (int i = 21; i <= 23; ++i) sum();
        T_CHECK_THROWS_WITH(sum(), Catch::Contains("collective #20") &&  // #24 compares
                                       Catch::Contains("rank 0 called all_reduce of 4 float32 sum") &&
                                       Catch::Contains("rank 1 called all_reduce of 4 float32 max"));
        // A matched program of every kind across several comparisons: no error, right results.
        std::vector<float> all(8);
        for (int i = 0; i < 40; ++i) {
          std::fill(v.begin(), v.end(), static_cast<float>(r + 1));
          world.allReduce(v.data(), 4, DType::Float32, ReduceOp::Sum);
          T_CHECK(v[0] == 3.0f);
          world.broadcast(v.data(), 4, DType::Float32, 1);
          world.allGather(v.data(), all.data(), 4, DType::Float32);
          T_CHECK(all[7] == 3.0f);
          world.barrier();
        }
      }, 20s, std::nullopt);
    }
  }
}

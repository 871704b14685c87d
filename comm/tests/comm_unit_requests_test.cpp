// In-process tests of requests: asynchronous collectives in call order, polled receives, dropped
// requests.
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

namespace {

int threadCount() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) n += e.is_directory() ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("comm: requests: async collectives keep call order, test() polls without blocking", "[comm]") {
  runRanks(3, [](int r, Communicator& world) {
    std::vector<int> a(1000, r), b(1000, 2 * r);
    Request ra = world.allReduceAsync(a.data(), a.size(), DType::Int32, ReduceOp::Sum);
    Request rb = world.allReduceAsync(b.data(), b.size(), DType::Int32, ReduceOp::Max);
    int c = 1;
    world.allReduce(&c, 1, DType::Int32, ReduceOp::Sum);  // queued behind the two
    rb.wait();
    ra.wait();
    T_CHECK(a[999] == 0 + 1 + 2);
    T_CHECK(b[0] == 4);
    T_CHECK(c == 3);

    if (r == 0) {
      double got = 0;
      Request rq = world.irecv(&got, 1, DType::Float64, kAnySource, 5);
      T_CHECK_FALSE(rq.test());
      world.barrier();  // rank 2 sends only after this
      for (int i = 0; i < 2000 && !rq.test(); ++i) std::this_thread::sleep_for(1ms);
      T_CHECK(rq.test());
      T_CHECK(rq.source() == 2);
      T_CHECK(got == 2.5);
    } else {
      world.barrier();
      if (r == 2) {
        double v = 2.5;
        world.send(&v, 1, DType::Float64, 0, 5);
      }
    }
  });
}

// Polling must not cost a thread per request (Gloo's waits only block), and a request dropped
// after one test() must not hold its dropper until the deadline.
TEST_CASE("comm: polled requests: 1000 tested receives take a bounded number of threads", "[comm]") {
  for (const char* transport : kUnitTransports) {
    DYNAMIC_SECTION(transport) {
      TransportScope scope(transport);
      constexpr int kMessages = 1000;
      runRanks(2, [&](int r, Communicator& world) {
        std::vector<int32_t> in(kMessages, -1);
        if (r == 0) {
          std::vector<Request> pending;
          const int before = threadCount();
          for (int i = 0; i < kMessages; ++i) {
            pending.push_back(world.irecv(&in[static_cast<size_t>(i)], 1, DType::Int32, 1, i));
            T_CHECK_FALSE(pending.back().test());
          }
          T_CHECK(threadCount() - before <= 2);  // one progress thread at most (plus slack)
          world.barrier();                      // rank 1 sends only now
          for (int i = kMessages - 1; i >= 0; --i) pending[static_cast<size_t>(i)].wait();
          for (int i = 0; i < kMessages; ++i) T_CHECK(in[static_cast<size_t>(i)] == 3 * i);
        } else {
          world.barrier();
          for (int i = kMessages - 1; i >= 0; --i) {  // in the reverse order of the receives
            int32_t v = 3 * i;
            world.send(&v, 1, DType::Int32, 0, i);
          }
        }
        world.barrier();
      });
    }
  }
}

TEST_CASE("comm: dropping a once-polled request returns at once", "[comm]") {
  for (const char* transport : kUnitTransports) {
    DYNAMIC_SECTION(transport) {
      TransportScope scope(transport);
      runRanks(2, [&](int r, Communicator& world) {
        if (r == 0) {
          char byte = 0;
          auto t0 = std::chrono::steady_clock::now();
          {
            Request never = world.irecv(&byte, 1, DType::Int8, 1, 42, 10s);  // nobody sends it
            T_CHECK_FALSE(never.test());
          }
          T_CHECK(std::chrono::steady_clock::now() - t0 < 1s);
          int v = 1;
          world.allReduce(&v, 1, DType::Int32, ReduceOp::Sum);  // the communicator goes on
          T_CHECK(v == 2);
        } else {
          int v = 1;
          world.allReduce(&v, 1, DType::Int32, ReduceOp::Sum);
        }
        auto t0 = std::chrono::steady_clock::now();
        world.destroy();  // the dropped receive is failed, not waited for
        T_CHECK(std::chrono::steady_clock::now() - t0 < 5s);
      });
    }
  }
}

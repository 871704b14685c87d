// In-process tests: types and reductions, init (file://, tcp:// through the C API, bad input),
// groups and misuse, on communicators whose ranks are threads of this process over a MemoryStore
// (comm_unit_support.hpp). The others: comm_unit_failure_test.cpp (timeouts, abort, mismatched
// collectives), comm_unit_requests_test.cpp, comm_unit_shm_test.cpp (the shared-memory transport).
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

std::string tempPath(const char* name) {
  return (std::filesystem::temp_directory_path() /
          (std::string("drun_comm_") + name + "_" + std::to_string(getpid()))).string();
}

}  // namespace

TEST_CASE("comm: shm copyBytes and copyToResult copy exactly the bytes memcpy would, at every length and alignment", "[comm]") {
  // lengths on both sides of the vector loop's threshold (2048), of its 128- and 64-byte strides,
  // of copyToResult's streaming threshold (4 MiB, where its head and tail around the 32-byte
  // aligned body matter), and large; source and destination at different offsets within a line
  const size_t lengths[] = {0, 1, 63, 64, 65, 127, 128, 129, 2047, 2048, 2049, 4096 + 13, (1u << 20) + 77,
                            (4u << 20) - 1, 4u << 20, (4u << 20) + 1, (4u << 20) + 127};
  std::vector<unsigned char> src((4u << 20) + 256), dst(src.size()), want(src.size());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  for (auto copy : {&detail::copyBytes, &detail::copyToResult})
    for (size_t n : lengths)
      for (size_t from : {0u, 1u, 17u, 33u})
        for (size_t to : {0u, 5u, 32u, 63u}) {
          std::fill(dst.begin(), dst.end(), 0xAB);
          want = dst;
          std::memcpy(want.data() + to, src.data() + from, n);
          copy(dst.data() + to, src.data() + from, n);
          INFO((copy == &detail::copyBytes ? "copyBytes" : "copyToResult") << ": length " << n << ", source offset "
                                                                          << from << ", destination offset " << to);
          REQUIRE(dst == want);  // the bytes around the copy untouched too
        }
}

TEST_CASE("comm: float16 and bfloat16 conversions round to nearest even", "[comm]") {
  CHECK(floatToHalf(1.0f) == 0x3C00);
  CHECK(floatToHalf(-2.0f) == 0xC000);
  CHECK(floatToHalf(65504.0f) == 0x7BFF);
  CHECK(floatToHalf(1e6f) == 0x7C00);                   // overflow -> inf
  CHECK(floatToHalf(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(floatToHalf(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);  // tie -> even
  CHECK(halfToFloat(0x3555) == Approx(0.333251953125f));
  CHECK(halfToFloat(0x0001) == std::ldexp(1.0f, -24));
  CHECK(std::isnan(halfToFloat(floatToHalf(NAN))));
  CHECK(floatToBfloat16(1.0f) == 0x3F80);
  CHECK(bfloat16ToFloat(0xC040) == -3.0f);
  CHECK(floatToBfloat16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);  // tie -> even
  for (float f : {0.0f, 1.5f, -7.25f, 1024.0f}) {
    CHECK(halfToFloat(floatToHalf(f)) == f);
    CHECK(bfloat16ToFloat(floatToBfloat16(f)) == f);
  }
}

TEST_CASE("comm: reduce ops that do not fit a dtype are refused by name", "[comm]") {
  CHECK_THROWS_WITH(checkOpFits(ReduceOp::BXor, DType::Float32),
                    Catch::Contains("bxor") && Catch::Contains("float32"));
  CHECK_THROWS_WITH(checkOpFits(ReduceOp::Avg, DType::Int32), Catch::Contains("avg"));
  CHECK_THROWS_AS(checkOpFits(static_cast<ReduceOp>(42), DType::Int8), drun::InvalidArgument);
  CHECK_THROWS_AS(dtypeSize(static_cast<DType>(-1)), drun::InvalidArgument);
  CHECK_NOTHROW(checkOpFits(ReduceOp::BAnd, DType::UInt8));
  CHECK_THROWS_WITH(parseBackend("mpi"), Catch::Contains("mpi"));
}

TEST_CASE("comm: local reductions compute in the element type", "[comm]") {
  int8_t a[] = {100, -3, 7}, b[] = {27, 5, 7}, out[3];
  detail::reduceFunction(DType::Int8, ReduceOp::Max)(out, a, b, 3);
  CHECK(out[0] == 100);
  CHECK(out[1] == 5);
  uint16_t h[] = {floatToHalf(1.5f), floatToHalf(-2.0f)}, k[] = {floatToHalf(2.0f), floatToHalf(0.25f)};
  detail::reduceFunction(DType::Float16, ReduceOp::Product)(h, h, k, 2);
  CHECK(halfToFloat(h[0]) == 3.0f);
  CHECK(halfToFloat(h[1]) == -0.5f);
  double d[] = {3.0, 9.0};
  detail::divideInPlace(d, 2, DType::Float64, 3);
  CHECK(d[1] == 3.0);
}

TEST_CASE("comm: file:// init connects ranks through a shared file", "[comm]") {
  std::string path = tempPath("init");
  std::filesystem::remove(path);
  std::vector<std::future<int>> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      InitOptions o;
      o.initMethod = "file://" + path;
      o.rank = r;
      o.worldSize = 2;
      o.timeout = 20s;
      o.socketIfname = "lo";
      auto world = init(o);
      int v = r + 1;
      world->allReduce(&v, 1, DType::Int32, ReduceOp::Sum);
      return v;
    }));
  for (auto& f : ranks) CHECK(f.get() == 3);
  std::filesystem::remove(path);
}

TEST_CASE("comm: bad init input names what is wrong", "[comm]") {
  InitOptions o;
  o.rank = 0;
  o.worldSize = 1;
  o.initMethod = "udp://x:1";
  CHECK_THROWS_WITH(init(o), Catch::Contains("udp://x:1"));
  o.initMethod = "tcp://localhost:notaport";
  CHECK_THROWS_AS(init(o), drun::InvalidArgument);
  o.initMethod = "env://";
  o.rank = 3;
  o.worldSize = 2;
  CHECK_THROWS_WITH(init(o), Catch::Contains("rank 3"));
  o.rank = 0;
  o.worldSize = 1;
  o.backend = Backend::Nccl;  // no GPU in CI, or NCCL not built: a clear error either way
  if (!ncclBuiltIn()) CHECK_THROWS_WITH(init(o), Catch::Contains("NCCL was not built"));
}

TEST_CASE("comm: groups: members reduce among themselves, non-members get a clear error", "[comm]") {
  runRanks(4, [](int r, Communicator& world) {
    auto evens = world.newGroup({0, 2});
    auto odds = world.newGroup({3, 1});
    if (r % 2 == 0) {
      T_REQUIRE(evens->isMember());
      T_CHECK(evens->rank() == r / 2);
      T_CHECK(evens->size() == 2);
      int64_t v = r + 1;
      evens->allReduce(&v, 1, DType::Int64, ReduceOp::Sum);
      T_CHECK(v == 1 + 3);
      T_CHECK_FALSE(odds->isMember());
      T_CHECK(odds->rank() == -1);
      int x = 0;
      T_CHECK_THROWS_WITH(odds->allReduce(&x, 1, DType::Int32, ReduceOp::Sum),
                        Catch::Contains("not a member of group 2"));
    } else {
      T_CHECK(odds->rank() == (r == 3 ? 0 : 1));  // group ranks follow the list's order
      int v = r;
      odds->broadcast(&v, 1, DType::Int32, 0);
      T_CHECK(v == 3);
    }
    world.barrier();
  });
}

TEST_CASE("comm: misuse fails with InvalidArgument and leaves the communicator usable", "[comm]") {
  runRanks(2, [](int r, Communicator& world) {
    float v = 1;
    T_CHECK_THROWS_WITH(world.send(&v, 1, DType::Float32, 5), Catch::Contains("rank 5"));
    T_CHECK_THROWS_WITH(world.send(&v, 1, DType::Float32, r), Catch::Contains("itself"));
    T_CHECK_THROWS_WITH(world.broadcast(&v, 1, DType::Float32, -1), Catch::Contains("root -1"));
    T_CHECK_THROWS_WITH(world.allReduce(&v, 1, DType::Float32, ReduceOp::BAnd), Catch::Contains("band"));
    T_CHECK_THROWS_WITH(world.allReduce(nullptr, 4, DType::Float32, ReduceOp::Sum), Catch::Contains("null"));
    T_CHECK_THROWS_WITH(world.send(&v, 1, DType::Float32, 1 - r, -2), Catch::Contains("tag"));
    T_CHECK_THROWS_AS(world.newGroup({0, 0}), drun::InvalidArgument);
    T_CHECK_THROWS_AS(world.barrier(-5ms), drun::InvalidArgument);
    world.allReduce(&v, 1, DType::Float32, ReduceOp::Sum);  // still usable
    T_CHECK(v == 2);
    world.destroy();
    T_CHECK_THROWS_WITH(world.barrier(), Catch::Contains("destroyed"));
  });
}

TEST_CASE("comm: the C API over tcp:// init: statuses, requests, groups, per-thread errors", "[comm]") {
  auto port = drun::rdzv::PortReservation::reserve("127.0.0.1");
  const std::string method = "tcp://127.0.0.1:" + std::to_string(port.port());
  port.release();  // rank 0's store binds it, as a worker's server binds MASTER_PORT
  drun::test::runThreads(2, [&](int r) {
    drun_comm_t* comm = nullptr;
    T_REQUIRE(drun_comm_init("gloo", method.c_str(), r, 2, 20000, &comm) == DRUN_OK);
    T_CHECK(drun_comm_rank(comm) == r);
    T_CHECK(drun_comm_size(comm) == 2);
    int32_t v = 5 * (r + 1), got = 0;
    drun_request_t* req = nullptr;
    if (r == 0) {
      T_REQUIRE(drun_isend(comm, &v, 1, DRUN_INT32, 1, 3, 0, &req) == DRUN_OK);
    } else {
      T_REQUIRE(drun_irecv(comm, &got, 1, DRUN_INT32, DRUN_ANY_SOURCE, 3, 0, &req) == DRUN_OK);
    }
    T_CHECK(drun_wait(req, 0) == DRUN_OK);
    int done = 0;
    T_CHECK(drun_test(req, &done) == DRUN_OK);
    T_CHECK(done == 1);
    if (r == 1) T_CHECK(got == 5);
    if (r == 1) T_CHECK(drun_request_source(req) == 0);
    drun_request_free(req);
    T_CHECK(drun_all_reduce(comm, &v, 1, DRUN_INT32, DRUN_MAX, 0) == DRUN_OK);
    T_CHECK(v == 10);
    T_CHECK(drun_all_reduce(comm, &v, 1, DRUN_FLOAT32, DRUN_BXOR, 0) == DRUN_EINVAL);
    T_CHECK(std::string(drun_last_error()).find("bxor") != std::string::npos);
    T_CHECK(drun_all_reduce(comm, &v, 1, static_cast<drun_dtype_t>(99), DRUN_SUM, 0) == DRUN_EINVAL);
    T_CHECK(drun_barrier(nullptr, 0) == DRUN_EINVAL);
    int only[] = {1};
    drun_comm_t* group = nullptr;
    T_REQUIRE(drun_comm_new_group(comm, only, 1, &group) == DRUN_OK);
    T_CHECK(drun_comm_rank(group) == (r == 1 ? 0 : -1));
    T_CHECK(drun_barrier(group, 0) == (r == 1 ? DRUN_OK : DRUN_EINVAL));
    drun_comm_destroy(group);
    drun_comm_destroy(comm);
  });
}

TEST_CASE("comm: init fails within its timeout when a rank never comes", "[comm]") {
  InitOptions o;
  o.rank = 0;
  o.worldSize = 2;
  o.timeout = 300ms;
  o.socketIfname = "lo";
  auto t0 = std::chrono::steady_clock::now();
  try {
    init(std::make_shared<drun::rdzv::MemoryStore>(), o);
    FAIL("init returned without rank 1");
  } catch (const drun::TimeoutError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("300ms") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
}

// The T_ assertions (tests/support/thread_checks.hpp) that rank threads use in place of Catch's:
// what fails is recorded with the thread's name, the expression and its values, and only there.
TEST_CASE("test support: assertions on rank threads record their failures for the test's thread", "[comm]") {
  using drun::test::ThreadChecks;
  ThreadChecks checks;
  std::vector<std::string> threw(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      ThreadChecks::Scope scope(checks, "rank " + std::to_string(r));
      try {
        const int two = 2;
        T_CHECK(two == 2);  // holds: nothing recorded
        T_CHECK_THROWS_AS(throw drun::TimeoutError("late"), drun::Error);
        T_CHECK_THROWS_WITH(throw std::runtime_error("rank 3 died"), Catch::Contains("rank 3") && Catch::Contains("died"));
        T_CHECK_NOTHROW(static_cast<void>(two));
        if (r == 0) return;
        T_CHECK(two == 3);
        {
          ThreadChecks::Note note("step 7");
          T_CHECK_FALSE(two == 2);
        }
        T_CHECK_THROWS_WITH(throw std::runtime_error("all well"), Catch::Contains("died"));
        T_CHECK_THROWS_AS(static_cast<void>(two), std::exception);
        auto boom = []() -> int { throw std::runtime_error("boom"); };
        T_CHECK(boom() == 1);  // an exception inside the expression
        T_REQUIRE(two > 5);
        T_CHECK(two == 4);  // not reached
      } catch (const ThreadChecks::Abort& e) {
        threw[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  const auto failures = checks.take();
  CHECK(threw[0].empty());
  CHECK(threw[1] == "T_REQUIRE failed");
  REQUIRE(failures.size() == 6);
  auto starts = [](const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; };
  for (const auto& f : failures) CHECK(starts(f, "rank 1"));
  CHECK_THAT(failures[0], Catch::Contains("comm_unit_test.cpp:") && Catch::Contains("CHECK(two == 3) with expansion 2 == 3"));
  CHECK(starts(failures[1], "rank 1, step 7: "));
  CHECK_THAT(failures[2], Catch::Contains("\"all well\"") && Catch::Contains("contains: \"died\""));
  CHECK_THAT(failures[3], Catch::Contains("nothing was thrown"));
  CHECK_THAT(failures[4], Catch::Contains("CHECK(boom() == 1) with expansion threw: boom"));
  CHECK_THAT(failures[5], Catch::Contains("REQUIRE(two > 5) with expansion 2 > 5"));
  CHECK(checks.take().empty());
}

// In-process tests: types and reductions, the file store, and communicators whose ranks are
// threads of this process over a MemoryStore (groups, misuse, timeouts, requests).
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
#include "thread_checks.hpp"

using namespace drun::comm;
using namespace std::chrono_literals;

namespace {

// Runs fn(rank, world) on `n` threads, each rank initialised over one shared MemoryStore. The
// ranks assert with the T_ macros (Catch2 is not thread-safe: thread_checks.hpp); their failures
// are reported here, then the first exception of any rank is rethrown.
void runRanks(int n, const std::function<void(int, Communicator&)>& fn, milliseconds timeout = 20s,
              bool check = false) {
  auto shared = drun::rdzv::MemoryStore::makeShared();
  drun::test::runThreads(n, [&](int r) {
    InitOptions o;
    o.rank = r;
    o.worldSize = n;
    o.timeout = timeout;
    o.socketIfname = "lo";
    o.checkCollectives = check;
    auto world = init(std::make_shared<drun::rdzv::MemoryStore>(shared), o);
    fn(r, *world);
  });
}

// DRUN_COMM_TRANSPORT for the communicators a test makes (in-process ranks share one host, so
// "auto" would pick shared memory for every one).
class TransportScope {
 public:
  explicit TransportScope(const char* transport) { setenv("DRUN_COMM_TRANSPORT", transport, 1); }
  ~TransportScope() { unsetenv("DRUN_COMM_TRANSPORT"); }
};
const char* const kUnitTransports[] = {"shm", "tcp"};

int threadCount() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) n += e.is_directory() ? 1 : 0;
  return n;
}

std::string tempPath(const char* name) {
  return (std::filesystem::temp_directory_path() /
          (std::string("drun_comm_") + name + "_" + std::to_string(getpid()))).string();
}

// Whether process_vm_readv may read this process's own memory (Yama or a container may refuse).
bool processMayReadItself() {
  uint64_t word = 42, got = 0;
  iovec local{&got, sizeof(got)}, remote{&word, sizeof(word)};
  return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == sizeof(got) && got == word;
}

// The `size` ranks' segments of one fresh communicator (64 KiB slots), attached side by side on
// threads of this process (attaching waits for every rank).
std::vector<std::unique_ptr<drun::comm::detail::ShmSegment>> makeSegments(int size) {
  using drun::comm::detail::ShmSegment;
  auto shared = drun::rdzv::MemoryStore::makeShared();
  std::vector<std::future<std::unique_ptr<ShmSegment>>> ranks;
  for (int r = 0; r < size; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      drun::rdzv::MemoryStore store(shared);
      drun::comm::detail::ShmOptions options;
      options.slotBytes = 64u << 10;
      return std::make_unique<ShmSegment>(store, r, size, options, 10s);
    }));
  std::vector<std::unique_ptr<ShmSegment>> segments;
  for (auto& r : ranks) segments.push_back(r.get());
  return segments;
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

TEST_CASE("comm: shm keeps at most DRUN_COMM_SHM_UNEXPECTED_BYTES of messages nobody receives yet", "[comm]") {
  TransportScope shm("shm");
  setenv("DRUN_COMM_SHM_UNEXPECTED_BYTES", "100000", 1);  // one 64 KiB message, not two
  struct Unset {
    ~Unset() { unsetenv("DRUN_COMM_SHM_UNEXPECTED_BYTES"); }
  } unset;
  constexpr int kMessages = 10;
  constexpr size_t kInts = 16 << 10;  // 64 KiB each: the ring (8 cells of 32 KiB) holds about 2
  std::latch checked(1);
  runRanks(2, [&](int r, Communicator& world) {
    if (r == 1) {
      int64_t done = 0;
      Request last = world.irecv(&done, 1, DType::Int64, 0, 1000);  // starts its progress thread
      checked.wait();
      std::vector<int32_t> in(kInts);
      for (int m = 0; m < kMessages; ++m) {
        world.recv(in.data(), in.size(), DType::Int32, 0, m, 10s);
        T_CHECK(in.front() == m);
        T_CHECK(in.back() == m);
      }
      last.wait(10s);
      T_CHECK(done == 7);
      return;
    }
    std::vector<std::vector<int32_t>> out;
    std::vector<Request> sends;
    for (int m = 0; m < kMessages; ++m) out.emplace_back(kInts, m);
    for (int m = 0; m < kMessages; ++m) sends.push_back(world.isend(out[m].data(), kInts, DType::Int32, 1, m, 20s));
    sends.front().wait(5s);  // kept by rank 1 (or in its ring)
    // Without the bound rank 1's progress thread would take every message at once; with it the
    // last one cannot leave until rank 1 posts receives.
    const auto until = std::chrono::steady_clock::now() + 300ms;
    bool lastDone = false;
    while (!lastDone && std::chrono::steady_clock::now() < until) {
      lastDone = sends.back().test();
      std::this_thread::sleep_for(10ms);
    }
    T_CHECK_FALSE(lastDone);
    checked.count_down();
    for (auto& s : sends) s.wait(10s);
    int64_t seven = 7;
    world.send(&seven, 1, DType::Int64, 1, 1000);
  });
}

// Defect: each rank wrote its probe word only when it probed, after the attach barrier, so a
// rank that probed first read a peer's word before it was written and single copy was off for
// the whole communicator (about every other run: large collectives took two copies). Threads of
// one process may always read their own process's memory, so here every probe must pass.
TEST_CASE("comm: shm segment: where every rank may read the others' memory, single copy is on", "[comm]") {
  REQUIRE(processMayReadItself());
  for (int size : {2, 3}) {
    for (int attempt = 0; attempt < 20; ++attempt)
      for (const auto& segment : makeSegments(size)) CHECK(segment->singleCopy());
  }
}

// readPeer (single copy's process_vm_readv), for lengths on both sides of 32 bytes and of a page,
// and source and destination at the same and at different offsets within a line: exactly the
// bytes asked for are copied, and nothing around them.
TEST_CASE("comm: shm segment: readPeer copies exactly the bytes asked for, wherever they lie", "[comm]") {
  REQUIRE(processMayReadItself());
  const auto segments = makeSegments(2);  // rank 1's pid is this process's: rank 0 reads this memory
  constexpr size_t kLarge = 256u << 10;
  const size_t lengths[] = {0, 1, 31, 32, 33, 4095, 4096 + 5, kLarge + 1, 3 * kLarge + 77};
  std::vector<unsigned char> src(3 * kLarge + 256), dst(src.size()), want(src.size());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t n : lengths)
    for (size_t from : {0u, 16u})
      for (size_t to : {0u, 1u, 16u, 44u, 48u}) {
        std::fill(dst.begin(), dst.end(), 0xAB);
        want = dst;
        std::memcpy(want.data() + to, src.data() + from, n);
        segments[0]->readPeer(1, reinterpret_cast<uint64_t>(src.data() + from), dst.data() + to, n);
        INFO("length " << n << ", source offset " << from << ", destination offset " << to);
        REQUIRE(dst == want);
      }
}

// Queued broadcasts (the root runs up to ShmCollectives::kMaxQueueDepth ahead of its readers): a
// loop of broadcasts from changing roots, of sizes on both sides of the queued limit (a 64 KiB
// slot: 32 KiB halves), mixed with all_reduces, with one reader that often falls behind:
// every rank gets every value (a root that reused a sub-slot before its readers were done, or a
// step that wrote over a queued broadcast still being read, would show here as wrong values).
TEST_CASE("comm: shm: queued broadcasts from changing roots, mixed with other collectives, deliver every value", "[comm]") {
  TransportScope scope("shm");
  struct SlotScope {  // 64 KiB slots
    SlotScope() { setenv("DRUN_COMM_SHM_BYTES", "65536", 1); }
    ~SlotScope() { unsetenv("DRUN_COMM_SHM_BYTES"); }
  } slots;
  constexpr int kRounds = 300;
  runRanks(3, [](int r, Communicator& world) {
    int wrong = 0;
    for (int i = 0; i < kRounds; ++i) {
      const int root = (i / 40) % 3;  // runs of 40 from one root: more than the queue's depth
      const size_t count = (i % 11 == 0) ? 3000 : 1 + (i * 37) % 900;  // 12 KB (chunked) or up to 3.6 KB
      std::vector<int32_t> v(count, r == root ? -1 : 0);
      if (r == root)
        for (size_t j = 0; j < count; ++j) v[j] = static_cast<int32_t>(i * 1000003 + j);
      if (r == 2 && i % 40 < 30) std::this_thread::sleep_for(std::chrono::microseconds(100));  // falls behind
      world.broadcast(v.data(), count, DType::Int32, root);
      for (size_t j = 0; j < count; ++j) wrong += v[j] != static_cast<int32_t>(i * 1000003 + j);
      if (i % 50 == 49) {
        int64_t x = r + i;
        world.allReduce(&x, 1, DType::Int64, ReduceOp::Sum);
        wrong += x != 3 * static_cast<int64_t>(i) + 3;
      }
    }
    T_CHECK(wrong == 0);
  });
}

// Small queued broadcasts (8 B to 4 KiB: queues 32 and 16 deep, sub-slots packed in consecutive
// cache lines) from a different root nearly every time, between all_reduces and all_gathers, at
// world 4 (more ranks than this machine's cores): every value arrives, in order, everywhere.
TEST_CASE("comm: shm: small broadcasts from a new root each time, between other collectives, deliver every value", "[comm]") {
  TransportScope scope("shm");
  constexpr int kRounds = 3000, kRanks = 4;
  runRanks(kRanks, [](int r, Communicator& world) {
    int wrong = 0;
    for (int i = 0; i < kRounds; ++i) {
      const int root = (i * 7 + i / 5) % kRanks;
      const size_t count = i % 97 == 0 ? 512 : 1 + (i * 13) % 16;  // 4 KiB, or 8 to 128 B of int64
      std::vector<int64_t> v(count, -1);
      if (r == root)
        for (size_t j = 0; j < count; ++j) v[j] = static_cast<int64_t>(i) * 1000003 + static_cast<int64_t>(j);
      world.broadcast(v.data(), count, DType::Int64, root);
      for (size_t j = 0; j < count; ++j) wrong += v[j] != static_cast<int64_t>(i) * 1000003 + static_cast<int64_t>(j);
      if (i % 7 == 3) {
        int64_t x = r + i;
        world.allReduce(&x, 1, DType::Int64, ReduceOp::Sum);
        wrong += x != kRanks * static_cast<int64_t>(i) + kRanks * (kRanks - 1) / 2;
      }
      if (i % 13 == 5) {
        int32_t mine = r * 1000 + i, all[kRanks] = {};
        world.allGather(&mine, all, 1, DType::Int32);
        for (int k = 0; k < kRanks; ++k) wrong += all[k] != k * 1000 + i;
      }
    }
    T_CHECK(wrong == 0);
  });
}

// all_gather with each rank's input inside its output (in place: the hierarchical backend's
// form, and torch's all_gather_into_tensor on a view) and apart, over the segment (under 2 MiB
// per rank: in chunks of the 64 KiB slot's halves) and single copy (from 2 MiB): every block
// lands, and a rank's own block is left as it was (the segment skips copying it onto itself).
TEST_CASE("comm: shm: all_gather in place and apart, through the segment and single copy, delivers every block", "[comm]") {
  TransportScope scope("shm");
  struct SlotScope {  // 64 KiB slots: 100 KiB per rank takes several steps
    SlotScope() { setenv("DRUN_COMM_SHM_BYTES", "65536", 1); }
    ~SlotScope() { unsetenv("DRUN_COMM_SHM_BYTES"); }
  } slots;
  const size_t counts[] = {1, 25601, (size_t{2} << 20) / 4 + 7};  // 4 B, 100 KiB, 2 MiB + 28 B
  int wrong[2][3][2] = {};  // [rank][count][in place]: Catch's assertions stay on this thread
  runRanks(2, [&](int r, Communicator& world) {
    for (size_t c = 0; c < 3; ++c)
      for (int inPlace : {1, 0}) {
        const size_t count = counts[c];
        auto value = [&](int rank, size_t j) { return static_cast<int32_t>(rank * 7919 + static_cast<int64_t>(j) % 104729 + 1); };
        std::vector<int32_t> all(2 * count, -1), mine(count);
        for (size_t j = 0; j < count; ++j) (inPlace ? all[static_cast<size_t>(r) * count + j] : mine[j]) = value(r, j);
        const int32_t* send = inPlace ? all.data() + static_cast<size_t>(r) * count : mine.data();
        world.allGather(send, all.data(), count, DType::Int32);
        for (int k = 0; k < 2; ++k)
          for (size_t j = 0; j < count; ++j) wrong[r][c][inPlace] += all[static_cast<size_t>(k) * count + j] != value(k, j);
      }
  });
  for (int r = 0; r < 2; ++r)
    for (size_t c = 0; c < 3; ++c)
      for (int inPlace : {1, 0}) {
        INFO("rank " << r << ", count " << counts[c] << (inPlace ? ", in place" : ", apart"));
        CHECK(wrong[r][c][inPlace] == 0);
      }
}

// Data in stamped lines (at most 56 bytes a rank writes in a step) beside data in the halves
// (sizes on both sides of 56 bytes), every op, queued broadcasts from changing roots between
// them, and a rank that falls behind now and then (its readers and writers must not overrun its
// lines): every value arrives everywhere.
TEST_CASE("comm: shm: ops on both sides of the stamped lines' 56 bytes, mixed, with a lagging rank, deliver every value", "[comm]") {
  TransportScope scope("shm");
  constexpr int kRounds = 1500, kRanks = 3;
  runRanks(kRanks, [](int r, Communicator& world) {
    int wrong = 0;
    auto value = [](int i, int rank, size_t j) { return static_cast<int64_t>(i) * 1000003 + rank * 1009 + static_cast<int64_t>(j); };
    for (int i = 0; i < kRounds; ++i) {
      const size_t count = 1 + static_cast<size_t>(i * 5) % 9;  // 8 to 72 bytes of int64
      if (r == 1 && i % 50 < 5) std::this_thread::sleep_for(std::chrono::microseconds(200));  // falls behind
      const int root = (i / 3) % kRanks;
      std::vector<int64_t> v(count, -1);
      if (r == root)
        for (size_t j = 0; j < count; ++j) v[j] = value(i, root, j);
      world.broadcast(v.data(), count, DType::Int64, root);
      for (size_t j = 0; j < count; ++j) wrong += v[j] != value(i, root, j);
      switch (i % 6) {
        case 0: {
          std::vector<int64_t> x(count);
          for (size_t j = 0; j < count; ++j) x[j] = value(i, r, j);
          world.allReduce(x.data(), count, DType::Int64, ReduceOp::Sum);
          for (size_t j = 0; j < count; ++j) wrong += x[j] != value(i, 0, j) + value(i, 1, j) + value(i, 2, j);
          break;
        }
        case 1: {
          std::vector<int64_t> mine(count), all(count * kRanks);
          for (size_t j = 0; j < count; ++j) mine[j] = value(i, r, j);
          world.allGather(mine.data(), all.data(), count, DType::Int64);
          for (int k = 0; k < kRanks; ++k)
            for (size_t j = 0; j < count; ++j) wrong += all[k * count + j] != value(i, k, j);
          break;
        }
        case 2: {  // block k of rank q: value(i, q, k * count + j)
          std::vector<int64_t> blocks(count * kRanks), out(count);
          for (size_t j = 0; j < blocks.size(); ++j) blocks[j] = value(i, r, j);
          world.reduceScatter(blocks.data(), out.data(), count, DType::Int64, ReduceOp::Sum);
          for (size_t j = 0; j < count; ++j) {
            const size_t at = static_cast<size_t>(r) * count + j;
            wrong += out[j] != value(i, 0, at) + value(i, 1, at) + value(i, 2, at);
          }
          break;
        }
        case 3: {
          std::vector<int64_t> send(count * kRanks), recv(count * kRanks);
          for (size_t j = 0; j < send.size(); ++j) send[j] = value(i, r, j);
          world.allToAll(send.data(), recv.data(), count, DType::Int64);
          for (int k = 0; k < kRanks; ++k)
            for (size_t j = 0; j < count; ++j) wrong += recv[k * count + j] != value(i, k, static_cast<size_t>(r) * count + j);
          break;
        }
        case 4: {
          std::vector<int64_t> mine(count), all(count * kRanks, -1), part(count, -1);
          for (size_t j = 0; j < count; ++j) mine[j] = value(i, r, j);
          world.gather(mine.data(), all.data(), count, DType::Int64, root);
          if (r == root)
            for (int k = 0; k < kRanks; ++k)
              for (size_t j = 0; j < count; ++j) wrong += all[k * count + j] != value(i, k, j);
          world.scatter(all.data(), part.data(), count, DType::Int64, root);  // the gathered blocks back
          for (size_t j = 0; j < count; ++j) wrong += part[j] != value(i, r, j);
          break;
        }
        default:
          world.barrier();
      }
    }
    T_CHECK(wrong == 0);
  });
}

// The hierarchical all_gather's large path with hosts whose ranks are not consecutive (ranks
// 0 and 2 on host A, 1 and 3 on host B: drun never numbers them so, a hand-made world may): the
// blocks go through a copy into their places. In-process ranks with made-up host identities.
TEST_CASE("comm: hierarchical all_gather: hosts of interleaved ranks, small and large", "[comm]") {
  using namespace drun::comm::detail;
  constexpr int kRanks = 4;
  const std::vector<std::string> hostOfRank = {"A", "B", "A", "B"};
  auto shared = drun::rdzv::MemoryStore::makeShared();
  std::vector<std::future<int>> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto store = std::make_shared<drun::rdzv::MemoryStore>(shared);
      BackendConfig config;
      config.store = store;
      config.rank = r;
      config.size = kRanks;
      config.timeout = 20s;
      config.socketIfname = "lo";
      ShmOptions shm;
      auto backend = makeHierarchicalBackend(store, r, hostOfRank, 20s, shm, makeGlooDevice(config));
      int wrong = 0;
      for (size_t count : {size_t{3}, size_t{(2u << 20) / 4 + 5}}) {  // 12 B and 2 MiB + 20 B per rank
        std::vector<int32_t> mine(count), all(count * kRanks, -1);
        for (size_t i = 0; i < count; ++i) mine[i] = static_cast<int32_t>(r * 1000003 + i);
        Collective c{OpKind::AllGather, mine.data(), all.data(), count, DType::Int32};
        c.timeout = 20s;
        backend->run(c);
        for (int from = 0; from < kRanks; ++from)
          for (size_t i = 0; i < count; ++i)
            wrong += all[static_cast<size_t>(from) * count + i] != static_cast<int32_t>(from * 1000003 + i);
      }
      return wrong;
    }));
  for (auto& f : ranks) CHECK(f.get() == 0);
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

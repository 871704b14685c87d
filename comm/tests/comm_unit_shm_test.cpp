// In-process tests of the shared-memory transport: its bound on unexpected messages, the segment
// (single copy, readPeer), queued broadcasts and mixed operations delivering every value, and the
// hierarchical all_gather over in-process "hosts".
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

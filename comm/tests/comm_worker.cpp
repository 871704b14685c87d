// comm_worker: one rank of the multi-process tests (run under build/bin/drun, or started by a
// test with RANK/WORLD_SIZE/MASTER_* set). Modes:
//   matrix [--quick]   every collective and point-to-point op x dtype x reduce op x sizes
//                      0, 1, odd, 1 MiB+, checked against a reference computed locally; then
//                      groups mixing ranks of one host and of several (runGroups)
//   loop               all_reduce in a loop until killed ("rank R: looping (transport)")
//   victim N           all_reduce in a loop; rank N SIGKILLs itself in the 3rd iteration; the
//                      survivors' all_reduce and their pending receive from rank N must fail
//                      within the timeout with an error naming rank N
//   bcast_victim N     8-byte broadcasts from rank 0 in a loop (queued: the root runs ahead of
//                      its readers); rank N SIGKILLs itself in the 500th; the survivors' next
//                      broadcasts must fail within the timeout naming rank N
// Prints "rank R: ok (N checks)" and exits 0, or prints what went wrong and exits 1.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "drun/comm/communicator.hpp"
#include "worker_checks.hpp"

using namespace drun::comm;
using namespace std::chrono_literals;

namespace {

WorkerChecks tally;
int me = 0;

// The value rank r contributes at index i, chosen so that every reduction over up to 7 ranks is
// exact in every dtype (products stay <= 2^7, sums <= 63, bit patterns < 128).
double input(int r, size_t i, ReduceOp op) {
  switch (op) {
    case ReduceOp::Product: return static_cast<double>((r + i) % 2 + 1);
    case ReduceOp::BAnd: case ReduceOp::BOr: case ReduceOp::BXor:
      return static_cast<double>((r * 37 + i * 11) & 0x7f);
    default: return static_cast<double>((r * 3 + i * 7) % 10);
  }
}

// Stores a double into element i of a typed buffer, and loads it back.
void put(void* buf, size_t i, DType d, double v) {
  switch (d) {
    case DType::Int8: static_cast<int8_t*>(buf)[i] = static_cast<int8_t>(v); break;
    case DType::UInt8: static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v); break;
    case DType::Int32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); break;
    case DType::Int64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); break;
    case DType::Float16: static_cast<uint16_t*>(buf)[i] = floatToHalf(static_cast<float>(v)); break;
    case DType::BFloat16: static_cast<uint16_t*>(buf)[i] = floatToBfloat16(static_cast<float>(v)); break;
    case DType::Float32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case DType::Float64: static_cast<double*>(buf)[i] = v; break;
  }
}
double get(const void* buf, size_t i, DType d) {
  switch (d) {
    case DType::Int8: return static_cast<const int8_t*>(buf)[i];
    case DType::UInt8: return static_cast<const uint8_t*>(buf)[i];
    case DType::Int32: return static_cast<const int32_t*>(buf)[i];
    case DType::Int64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DType::Float16: return halfToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DType::BFloat16: return bfloat16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DType::Float32: return static_cast<const float*>(buf)[i];
    case DType::Float64: return static_cast<const double*>(buf)[i];
  }
  return 0;
}

// The reduction of every rank's input at index i, computed here in 64-bit arithmetic.
double reference(int n, size_t i, ReduceOp op) {
  int64_t acc = static_cast<int64_t>(input(0, i, op));
  double accd = input(0, i, op);
  for (int r = 1; r < n; ++r) {
    double v = input(r, i, op);
    int64_t iv = static_cast<int64_t>(v);
    switch (op) {
      case ReduceOp::Sum: case ReduceOp::Avg: accd += v; break;
      case ReduceOp::Product: accd *= v; break;
      case ReduceOp::Min: accd = std::min(accd, v); break;
      case ReduceOp::Max: accd = std::max(accd, v); break;
      case ReduceOp::BAnd: acc &= iv; break;
      case ReduceOp::BOr: acc |= iv; break;
      case ReduceOp::BXor: acc ^= iv; break;
    }
  }
  if (op == ReduceOp::BAnd || op == ReduceOp::BOr || op == ReduceOp::BXor) return static_cast<double>(acc);
  if (op == ReduceOp::Avg) return accd / n;
  return accd;
}

// The reference as the dtype holds it (rounded like a stored element).
double get_ref(int n, size_t i, ReduceOp op, DType d) {
  double v = reference(n, i, op);
  std::vector<char> one(8);
  put(one.data(), 0, d, v);
  return get(one.data(), 0, d);
}

bool close(double got, double want, DType d) {
  double tol = d == DType::Float16 || d == DType::BFloat16 ? 1e-2 : (d == DType::Float32 ? 1e-6 : 0);
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

std::string label(const std::string& what, DType d, ReduceOp op, size_t count) {
  return std::string(what) + " " + toString(d) + " " + toString(op) + " count " + std::to_string(count);
}

// Compares buf[i] with want(i) for i < count; reports the first mismatch.
void expect(const std::string& what, const void* buf, size_t count, DType d,
            const std::function<double(size_t)>& want) {
  ++tally.checks;
  for (size_t i = 0; i < count; ++i) {
    double w = want(i), g = get(buf, i, d);
    if (!close(g, w, d)) {
      std::printf("rank %d: MISMATCH %s at %zu: got %g, want %g\n", me, what.c_str(), i, g, w);
      ++tally.failures;
      return;
    }
  }
}

bool fits(ReduceOp op, DType d) {
  try {
    checkOpFits(op, d);
    return true;
  } catch (const drun::InvalidArgument&) {
    return false;
  }
}

void runLarge(Communicator& c);

void runMatrix(Communicator& c, bool quick) {
  const int n = c.size(), r = c.rank();
  const DType dtypes[] = {DType::Int8, DType::UInt8, DType::Int32, DType::Int64,
                          DType::Float16, DType::BFloat16, DType::Float32, DType::Float64};
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Product, ReduceOp::Min, ReduceOp::Max,
                          ReduceOp::Avg, ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor};
  int round = 0;
  for (DType d : dtypes) {
    const size_t es = dtypeSize(d);
    const size_t big = (quick ? (64u << 10) : (1u << 20)) / es + 3;  // 1 MiB + 3 elements
    for (size_t count : {size_t{0}, size_t{1}, size_t{37}, big}) {
      // Zero-element collectives return at once, so ranks may be a round apart here: each
      // round's messages carry their own tag (recv from any would otherwise match the next round).
      const int tag = 100 + round++;
      // Reductions: every op that fits the dtype; the large size with sum only in quick mode.
      for (ReduceOp op : ops) {
        if (!fits(op, d) || (quick && count == big && op != ReduceOp::Sum)) continue;
        std::vector<char> buf(count * es + 1), out(count * es + 1);
        auto fill = [&] { for (size_t i = 0; i < count; ++i) put(buf.data(), i, d, input(r, i, op)); };
        auto want = [&](size_t i) { return get_ref(n, i, op, d); };
        fill();
        c.allReduce(buf.data(), count, d, op);
        expect(label("all_reduce", d, op, count), buf.data(), count, d, want);
        fill();
        int root = n - 1;
        c.reduce(buf.data(), count, d, op, root);
        if (r == root) expect(label("reduce", d, op, count), buf.data(), count, d, want);
        // reduce_scatter: rank r's block j is input(r, j*count + i); block r of the result.
        std::vector<char> blocks(count * es * n + 1);
        for (size_t i = 0; i < count * n; ++i) put(blocks.data(), i, d, input(r, i, op));
        c.reduceScatter(blocks.data(), out.data(), count, d, op);
        expect(label("reduce_scatter", d, op, count), out.data(), count, d,
               [&](size_t i) { return get_ref(n, r * count + i, op, d); });
        fill();
        c.allReduceAsync(buf.data(), count, d, op).wait();
        expect(label("all_reduce async", d, op, count), buf.data(), count, d, want);
      }
      // Data movement: values encode (source rank, index).
      auto val = [&](int src, size_t i) { return static_cast<double>((src * 5 + i) % 11); };
      std::vector<char> buf(count * es + 1), all(count * es * n + 1), mine(count * es * n + 1);
      // broadcast from every root: a host's leader or not (the hierarchical paths differ).
      for (int from = 0; from < n; ++from) {
        for (size_t i = 0; i < count; ++i) put(buf.data(), i, d, r == from ? val(from, i) : 0);
        c.broadcast(buf.data(), count, d, from);
        expect(label("broadcast from " + std::to_string(from), d, ReduceOp::Sum, count), buf.data(),
               count, d, [&](size_t i) { return val(from, i); });
      }
      int root = (n > 1) ? 1 : 0;

      for (size_t i = 0; i < count * n; ++i) put(mine.data(), i, d, r == root ? val(static_cast<int>(i / std::max<size_t>(count, 1)), i) : 0);
      c.scatter(mine.data(), buf.data(), count, d, root);
      expect(label("scatter", d, ReduceOp::Sum, count), buf.data(), count, d,
             [&](size_t i) { return val(r, r * count + i); });

      for (size_t i = 0; i < count; ++i) put(buf.data(), i, d, val(r, i));
      c.gather(buf.data(), r == root ? all.data() : nullptr, count, d, root);
      if (r == root)
        expect(label("gather", d, ReduceOp::Sum, count), all.data(), count * n, d,
               [&](size_t i) { return val(static_cast<int>(i / count), i % count); });
      c.allGather(buf.data(), all.data(), count, d);
      expect(label("all_gather", d, ReduceOp::Sum, count), all.data(), count * n, d,
             [&](size_t i) { return val(static_cast<int>(i / count), i % count); });

      // all_to_all: rank r sends val(r, j*count+i) to rank j as block r.
      for (size_t i = 0; i < count * n; ++i) put(mine.data(), i, d, val(r, i));
      c.allToAll(mine.data(), all.data(), count, d);
      expect(label("all_to_all", d, ReduceOp::Sum, count), all.data(), count * n, d,
             [&](size_t i) { return val(static_cast<int>(i / count), r * count + i % count); });

      if (n > 1) {  // ring: send to the right, receive from the left (blocking and async)
        int right = (r + 1) % n, left = (r + n - 1) % n;
        for (size_t i = 0; i < count; ++i) put(buf.data(), i, d, val(r, i));
        Request s = c.isend(buf.data(), count, d, right, tag);
        std::vector<char> in(count * es + 1);
        Request rq = c.irecv(in.data(), count, d, left, tag);
        rq.wait();
        s.wait();
        expect(label("isend/irecv", d, ReduceOp::Sum, count), in.data(), count, d, [&](size_t i) { return val(left, i); });
        if (r == 0) {  // rank 0 collects one message from every other rank, from any source
          for (int k = 1; k < n; ++k) {
            int src = c.recv(in.data(), count, d, kAnySource, tag);
            expect(label("recv any", d, ReduceOp::Sum, count), in.data(), count, d, [&](size_t i) { return val(src, i); });
          }
        } else {
          c.send(buf.data(), count, d, 0, tag);
        }
      }
    }
  }
  if (!quick) runLarge(c);
  c.barrier();
}

// Sizes whose hierarchical paths cut the data into pieces (broadcast: several Gloo messages, the
// last one shorter) or split it among the local ranks with a remainder: float32, sum, values
// that tell ranks and positions apart.
void runLarge(Communicator& c) {
  const int n = c.size(), r = c.rank();
  const size_t count = (9u << 20) / sizeof(float) + 3;
  auto val = [](int src, size_t i) { return static_cast<float>((static_cast<size_t>(src) * 7 + i) % 13); };
  std::vector<float> buf(count);
  for (int from = 0; from < n; ++from) {
    for (size_t i = 0; i < count; ++i) buf[i] = r == from ? val(from, i) : -1.0f;
    c.broadcast(buf.data(), count, DType::Float32, from);
    expect(label("large broadcast from " + std::to_string(from), DType::Float32, ReduceOp::Sum, count), buf.data(), count,
           DType::Float32, [&](size_t i) { return val(from, i); });
  }
  for (size_t i = 0; i < count; ++i) buf[i] = val(r, i);
  c.allReduce(buf.data(), count, DType::Float32, ReduceOp::Sum);
  expect(label("large all_reduce", DType::Float32, ReduceOp::Sum, count), buf.data(), count, DType::Float32, [&](size_t i) {
    double sum = 0;
    for (int k = 0; k < n; ++k) sum += val(k, i);
    return sum;
  });
  const size_t block = count / static_cast<size_t>(n);
  std::vector<float> all(block * static_cast<size_t>(n)), mine(block);
  for (size_t i = 0; i < block; ++i) mine[i] = val(r, i);
  c.allGather(mine.data(), all.data(), block, DType::Float32);
  expect(label("large all_gather", DType::Float32, ReduceOp::Sum, block), all.data(), all.size(), DType::Float32,
         [&](size_t i) { return val(static_cast<int>(i / block), i % block); });
  for (size_t i = 0; i < all.size(); ++i) all[i] = val(r, i);
  c.reduceScatter(all.data(), mine.data(), block, DType::Float32, ReduceOp::Sum);
  expect(label("large reduce_scatter", DType::Float32, ReduceOp::Sum, block), mine.data(), block, DType::Float32,
         [&](size_t i) {
           double sum = 0;
           for (int k = 0; k < n; ++k) sum += val(k, static_cast<size_t>(r) * block + i);
           return sum;
         });
}

// Groups that mix ranks of one host and of several (on 2 hosts x 2: {0,1,2} is hierarchical,
// {0,3} TCP, {2,3} shared memory, {0,2,3,1} hierarchical with each host's ranks not consecutive
// in the group): each runs the hierarchical ops and one that is not, checked.
void runGroups(Communicator& world) {
  const int n = world.size();
  std::vector<std::vector<int>> lists = {{0, n - 1}};
  if (n > 2) {
    lists.push_back({});
    for (int r = 0; r + 1 < n; ++r) lists.back().push_back(r);
    lists.push_back({n - 2, n - 1});
    lists.push_back({0});  // rank 0, the second half, the rest of the first
    for (int r = n / 2; r < n; ++r) lists.back().push_back(r);
    for (int r = 1; r < n / 2; ++r) lists.back().push_back(r);
  }
  for (const auto& ranks : lists) {
    auto g = world.newGroup(ranks);
    if (!g->isMember()) continue;
    const int gn = g->size(), gr = g->rank();
    std::string name;
    for (int r : ranks) name += (name.empty() ? "" : ",") + std::to_string(r);
    std::printf("rank %d: group {%s} transport %s\n", me, name.c_str(), g->transport().c_str());
    std::vector<int64_t> v(1000, me), all(static_cast<size_t>(gn)), b(37, gr == gn - 1 ? 7 : 0);
    g->allReduce(v.data(), v.size(), DType::Int64, ReduceOp::Sum);
    int64_t sum = 0;
    for (int r : ranks) sum += r;
    expect("group all_reduce {" + name + "}", v.data(), v.size(), DType::Int64, [&](size_t) { return double(sum); });
    g->broadcast(b.data(), b.size(), DType::Int64, gn - 1);
    expect("group broadcast {" + name + "}", b.data(), b.size(), DType::Int64, [](size_t) { return 7.0; });
    int64_t mine = me;
    g->allGather(&mine, all.data(), 1, DType::Int64);
    expect("group all_gather {" + name + "}", all.data(), all.size(), DType::Int64,
           [&](size_t i) { return double(ranks[i]); });
    g->barrier();
    // Block j's element k: 1000 * the world rank + 10 * j + k, so that a block from the wrong
    // place or rank shows.
    std::vector<int64_t> blocks(static_cast<size_t>(gn) * 3), out(3);
    for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = 1000 * me + 10 * static_cast<int64_t>(i / 3) + static_cast<int64_t>(i % 3);
    g->reduceScatter(blocks.data(), out.data(), 3, DType::Int64, ReduceOp::Sum);
    expect("group reduce_scatter {" + name + "}", out.data(), 3, DType::Int64,
           [&](size_t k) { return double(1000 * sum + gn * (10 * gr + static_cast<int64_t>(k))); });
  }
}

// Prints "rank R: [what]NAMED after N ms: <error>" (or UNNAMED); true when the error names the
// victim within the 10 s timeout (plus 3 s of slack) since `start`.
bool reportVictimError(const char* what, const drun::Error& e, int victim, std::chrono::steady_clock::time_point start) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  const bool named = std::string(e.what()).find("rank " + std::to_string(victim)) != std::string::npos;
  std::printf("rank %d: %s%s after %lld ms: %s\n", me, what, named ? "NAMED" : "UNNAMED", static_cast<long long>(ms), e.what());
  return named && ms < 10000 + 3000;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "matrix";
  try {
    auto world = init();
    me = tally.rank = world->rank();
    if (mode == "matrix") {
      bool quick = argc > 2 && std::strcmp(argv[2], "--quick") == 0;
      std::printf("rank %d: transport %s\n", me, world->transport().c_str());
      runMatrix(*world, quick);
      if (world->size() > 1) runGroups(*world);
    } else if (mode == "victim") {
      int victim = argc > 2 ? std::atoi(argv[2]) : world->size() - 1;
      std::vector<float> v(1 << 16, 1.0f);
      auto start = std::chrono::steady_clock::now();
      const auto timeout = 10s;
      // A receive from the victim that it never sends: pending when it dies.
      float never = 0;
      Request pending;
      if (me != victim) pending = world->irecv(&never, 1, DType::Float32, victim, 77, timeout);
      try {
        for (int it = 0; it < 1000; ++it) {
          if (it == 3 && me == victim) kill(getpid(), SIGKILL);
          if (it == 3) start = std::chrono::steady_clock::now();
          world->allReduce(v.data(), v.size(), DType::Float32, ReduceOp::Sum, timeout);
        }
        std::printf("rank %d: FAIL: no error after the victim died\n", me);
        return 1;
      } catch (const drun::Error& e) {
        bool named = reportVictimError("", e, victim, start);
        try {
          pending.wait();
          std::printf("rank %d: FAIL: the pending receive from the victim completed\n", me);
          return 1;
        } catch (const drun::Error& p) {
          named = reportVictimError("pending receive ", p, victim, start) && named;
        }
        return named ? 0 : 1;
      }
    } else if (mode == "bcast_victim") {
      const int victim = argc > 2 ? std::atoi(argv[2]) : world->size() - 1;
      const auto timeout = 10s;
      auto start = std::chrono::steady_clock::now();
      try {
        for (int64_t it = 0; it < 1000000; ++it) {
          if (it == 500 && me == victim) kill(getpid(), SIGKILL);
          if (it == 500) start = std::chrono::steady_clock::now();
          int64_t v = me == 0 ? it : -1;
          world->broadcast(&v, 1, DType::Int64, 0, timeout);
          if (v != it) {
            std::printf("rank %d: FAIL: broadcast %lld delivered %lld\n", me, static_cast<long long>(it), static_cast<long long>(v));
            return 1;
          }
        }
        std::printf("rank %d: FAIL: no error after the victim died\n", me);
        return 1;
      } catch (const drun::Error& e) {
        return reportVictimError("", e, victim, start) ? 0 : 1;
      }
    } else if (mode == "absent") {  // one rank never enters the 3rd all_reduce: the others name it
      const int absent = argc > 2 ? std::atoi(argv[2]) : world->size() - 1;
      int64_t x = me;
      for (int it = 0; it < 2; ++it) world->allReduce(&x, 1, DType::Int64, ReduceOp::Sum, 20s);
      if (me == absent) {
        // Busy elsewhere: a receive nobody sends, which ends when the others' timeouts did.
        int64_t never = 0;
        try {
          world->recv(&never, 1, DType::Int64, (me + 1) % world->size(), 99, 8s);
        } catch (const drun::Error&) {
        }
        std::printf("rank %d: stayed away\n", me);
        return 0;
      }
      try {
        world->allReduce(&x, 1, DType::Int64, ReduceOp::Sum, 3s);
        std::printf("rank %d: FAIL: no timeout\n", me);
        return 1;
      } catch (const drun::TimeoutError& e) {
        std::printf("rank %d: TIMEOUT %s\n", me, e.what());
        return 0;
      }
    } else if (mode == "loop") {  // all_reduce until killed (the test SIGKILLs every rank)
      std::vector<float> v(1 << 16, 1.0f);
      for (long it = 0;; ++it) {
        world->allReduce(v.data(), v.size(), DType::Float32, ReduceOp::Max, 30s);
        if (it == 10) {
          std::printf("rank %d: looping (%s)\n", me, world->transport().c_str());
          std::fflush(stdout);
        }
      }
    } else {
      std::fprintf(stderr, "comm_worker: unknown mode '%s'\n", mode.c_str());
      return 2;
    }
    world->destroy();
  } catch (const std::exception& e) {
    std::printf("rank %d: ERROR %s\n", me, e.what());
    return 1;
  }
  return tally.report();
}


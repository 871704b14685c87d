// The nccl-tests-style command line and table shared by drun-comm-bench and its raw-Gloo
// reference (so scripts/bench/comm.sh compares like with like). Header-only; single-threaded.
//
//   --op all_reduce --min-bytes 8 --max-bytes 64M --factor 2 --iters 20 --warmup 5 [--min-time-ms T] [--check]
//   size(B) count type redop root time(us) algbw(GB/s) busbw(GB/s) #wrong
// size is the whole buffer (all_gather: the received n*count, reduce_scatter and all_to_all:
// the sent n*count); algbw = size / time (GB = 1e9 bytes); busbw = algbw * nccl-tests' factor.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace drun::bench {

struct Args {
  std::string op = "all_reduce";
  std::string backend = "gloo";
  size_t minBytes = 8, maxBytes = 64 << 20;
  double factor = 2;
  int iters = 20, warmup = 5;
  double minTimeMs = 0;  // a loop shorter than this runs again, longer (0: --iters only)
  bool check = false;
};

// The most iterations a loop lengthened to --min-time-ms runs.
inline constexpr long kMaxIters = 100000;

// "8", "64K", "64M", "1G" (powers of 1024, as nccl-tests).
inline size_t parseBytes(const std::string& text) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || v < 0) throw std::invalid_argument("bad size '" + text + "'");
  std::string unit(end);
  double scale = unit.empty() ? 1 : unit == "K" ? 1024.0 : unit == "M" ? 1048576.0 : unit == "G" ? 1073741824.0 : -1;
  if (scale < 0) throw std::invalid_argument("bad size unit in '" + text + "' (K, M or G)");
  return static_cast<size_t>(v * scale);
}

inline Args parseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
      return argv[++i];
    };
    if (k == "--op") a.op = next();
    else if (k == "--backend") a.backend = next();
    else if (k == "--min-bytes") a.minBytes = parseBytes(next());
    else if (k == "--max-bytes") a.maxBytes = parseBytes(next());
    else if (k == "--factor") a.factor = std::stod(next());
    else if (k == "--iters") a.iters = std::stoi(next());
    else if (k == "--warmup") a.warmup = std::stoi(next());
    else if (k == "--min-time-ms") a.minTimeMs = std::stod(next());
    else if (k == "--check") a.check = true;
    else throw std::invalid_argument("unknown option " + k);
  }
  if (a.op != "all_reduce" && a.op != "reduce" && a.op != "all_gather" && a.op != "reduce_scatter" && a.op != "all_to_all" &&
      a.op != "broadcast")
    throw std::invalid_argument("--op must be all_reduce, reduce, all_gather, reduce_scatter, all_to_all or broadcast");
  if (a.factor <= 1 || a.iters < 1 || a.warmup < 0 || a.minBytes < 1 || a.maxBytes < a.minBytes ||
      a.maxBytes > (size_t{1} << 32) || !(a.minTimeMs >= 0 && a.minTimeMs <= 60000))
    throw std::invalid_argument("need --factor > 1, --iters >= 1, --warmup >= 0, 1 <= min <= max <= 4G, 0 <= --min-time-ms <= 60000");
  return a;
}

// nccl-tests' bus bandwidth factor for n ranks.
inline double busFactor(const std::string& op, int n) {
  if (n <= 1) return 0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast" || op == "reduce") return 1;
  return static_cast<double>(n - 1) / n;  // all_gather, reduce_scatter, all_to_all
}

inline void printHeader(const Args& a, int n, const char* impl) {
  std::printf("# %s: %s, %d ranks, %s backend, iters %d, warmup %d\n", impl, a.op.c_str(), n,
              a.backend.c_str(), a.iters, a.warmup);
  std::printf("# %12s %12s %8s %6s %5s %10s %11s %11s %6s\n", "size(B)", "count", "type", "redop",
              "root", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
}

inline void printRow(const Args& a, int n, size_t bytes, double us, long wrong) {
  double algbw = us > 0 ? bytes / (us * 1e3) : 0;
  char w[32];
  if (a.check) std::snprintf(w, sizeof(w), "%ld", wrong);
  else std::snprintf(w, sizeof(w), "N/A");
  std::printf("  %12zu %12zu %8s %6s %5d %10.2f %11.3f %11.3f %6s\n", bytes, bytes / 4, "float",
              a.op == "all_reduce" || a.op == "reduce" || a.op == "reduce_scatter" ? "sum" : "none", -1, us, algbw,
              algbw * busFactor(a.op, n), w);
  std::fflush(stdout);
}

// The sweep every benchmark runs: for each size, measure(count, total) gets the elements per
// rank's block (the whole buffer for all_reduce) and in the whole buffer, and returns the slowest
// rank's time in us and the #wrong; the rows and the footer are printed where `print` holds.
template <class Measure>
void sweep(const Args& a, int n, bool print, Measure measure) {
  const bool allReduce = a.op == "all_reduce" || a.op == "reduce" || a.op == "broadcast";  // one whole buffer
  double busbwSum = 0;
  int rows = 0;
  // One discarded pass over the smallest size: the first moments of a job (processes just
  // started, the store and the launcher still busy) are not the transport's speed.
  {
    const size_t count = allReduce ? std::max<size_t>(1, a.minBytes / 4) : std::max<size_t>(1, a.minBytes / 4 / n);
    measure(count, allReduce ? count : count * n);
  }
  for (size_t bytes = a.minBytes; bytes <= a.maxBytes;
       bytes = std::max(bytes + 1, static_cast<size_t>(bytes * a.factor))) {
    const size_t count = allReduce ? std::max<size_t>(1, bytes / 4) : std::max<size_t>(1, bytes / 4 / n);
    const size_t total = allReduce ? count : count * n;
    auto [us, wrong] = measure(count, total);
    const size_t reported = total * sizeof(float);
    if (print) printRow(a, n, reported, us, wrong);
    busbwSum += reported / (us * 1e3) * busFactor(a.op, n);
    ++rows;
  }
  if (print) std::printf("# Avg bus bandwidth : %.3f\n", rows ? busbwSum / rows : 0.0);
}

// --warmup runs, sync(), then the slowest rank's average time in us (maxOf: the maximum over the
// ranks) of --iters runs. Where that loop took less than --min-time-ms, it runs again (after
// sync()) with as many iterations as fill that time, at most kMaxIters, every rank taking the
// count from the slowest rank's time: 20 runs of a 0.2 us operation last 4 us, about one context
// switch or one rank leaving the barrier late, which then decides the row (OSU's benchmarks
// run small messages 10,000 times for the same reason).
template <class Op, class Sync, class Max>
double timeIt(const Args& a, Op op, Sync sync, Max maxOf) {
  for (int i = 0; i < a.warmup; ++i) op();
  auto loop = [&](long n) {
    sync();
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < n; ++i) op();
    return maxOf(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  };
  long n = a.iters;
  double total = loop(n);
  const double wanted = a.minTimeMs * 1e3;
  if (total < wanted) {
    n = std::min(kMaxIters, std::max(n, static_cast<long>(std::ceil(n * wanted / std::max(total, 1e-3)))));
    total = loop(n);
  }
  return total / static_cast<double>(n);
}

}  // namespace drun::bench

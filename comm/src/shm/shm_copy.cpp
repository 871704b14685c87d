#include "shm/shm_copy.hpp"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace drun::comm::detail {
namespace {

// Below this glibc copies with vector moves of its own (rep movsb starts at 2112 bytes here).
constexpr size_t kVectorCopyBytes = 2048;
// copyToResult streams from here: a copy this large rarely finds its source or destination in
// the cache, and streaming it is then faster, while one that does (the same block again and
// again) loses little (docs/benchmarks/comm.md). glibc would stream too, from 3/4 of the shared
// cache, but can read the cache's size wrong on VMs (256 MiB where sysfs says 32).
constexpr size_t kStreamBytes = 4u << 20;

#if defined(__x86_64__)
// 128 bytes a step; what is left under that is the caller's. Streamed: non-temporal stores,
// which bypass the caches (no read of each destination line before its write, no eviction of
// what the operation reads next) and need a 32-byte aligned destination.
template <bool Stream>
__attribute__((target("avx2"))) size_t copyAvx2Lines(char* d, const char* s, size_t n) {
  auto store = [](char* to, __m256i v) __attribute__((target("avx2"))) {
    if constexpr (Stream) _mm256_stream_si256(reinterpret_cast<__m256i*>(to), v);
    else _mm256_storeu_si256(reinterpret_cast<__m256i*>(to), v);
  };
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {  // four loads, then four stores: GCC kept a loop over 32 bytes
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    store(d + i, a);
    store(d + i + 32, b);
    store(d + i + 64, c);
    store(d + i + 96, e);
  }
  if constexpr (Stream) _mm_sfence();
  return i;
}

// Without AVX2 glibc's choice stands: the loop above needs AVX2, and the slowdown it avoids is
// known from AVX2 machines only.
bool haveAvx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
}

#endif

}  // namespace

void copyToResult(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (n >= kStreamBytes && haveAvx2()) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    const size_t head = (32 - reinterpret_cast<uintptr_t>(d) % 32) % 32;
    copyBytes(d, s, head);
    const size_t body = copyAvx2Lines<true>(d + head, s + head, n - head);
    return copyBytes(d + head + body, s + head + body, n - head - body);
  }
#endif
  copyBytes(dst, src, n);
}

void copyBytes(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (n >= kVectorCopyBytes) {
    if (haveAvx2()) {
      auto* d = static_cast<char*>(dst);
      const auto* s = static_cast<const char*>(src);
      const size_t lines = copyAvx2Lines<false>(d, s, n);
      if (lines < n) std::memcpy(d + lines, s + lines, n - lines);  // under 128 bytes: no rep movsb
      return;
    }
  }
#endif
  if (n > 0) std::memcpy(dst, src, n);
}

}  // namespace drun::comm::detail

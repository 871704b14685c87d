#include "shm/shm_copy.hpp"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace drun::comm::detail {
namespace {

// Below this glibc copies with vector moves of its own (rep movsb starts at 2112 bytes here).
constexpr size_t kVectorCopyBytes = 2048;

#if defined(__x86_64__)
__attribute__((target("avx2"))) void copyAvx2(char* d, const char* s, size_t n) {
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  if (i < n) std::memcpy(d + i, s + i, n - i);  // under 128 bytes: no rep movsb
}

#endif

}  // namespace

void copyBytes(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (n >= kVectorCopyBytes) {
    // Without AVX2 (no machine this was measured on) glibc's choice stands.
    static const bool avx2 = __builtin_cpu_supports("avx2");
    if (avx2) return copyAvx2(static_cast<char*>(dst), static_cast<const char*>(src), n);
  }
#endif
  if (n > 0) std::memcpy(dst, src, n);
}

}  // namespace drun::comm::detail

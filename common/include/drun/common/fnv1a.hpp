// FNV-1a, 64 bits: a fast identity check of bytes (not a secret), the same on every node and
// build, for values nodes compare or derive alike (a roster's digest, a job's etcd lease id).
#pragma once

#include <cstdint>
#include <string_view>

namespace drun {

struct Fnv1a {
  uint64_t value = 14695981039346656037ull;
  Fnv1a& mix(std::string_view bytes) {
    for (const unsigned char c : bytes) value = (value ^ c) * 1099511628211ull;
    return *this;
  }
};

}  // namespace drun

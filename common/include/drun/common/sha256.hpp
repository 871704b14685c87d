// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104): what the rendezvous store's challenge-response
// needs, without a crypto library. Not constant-time beyond equalDigests(); the secrets it
// handles are MAC keys, never compared byte by byte with early exit.
//
// Threading: Sha256 is a value (one per thread); the functions are pure and thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace drun::crypto {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(std::string_view data);
  Digest finish();  // the object is spent afterwards

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t length_ = 0;  // bytes hashed so far
};

Digest sha256(std::string_view data);
Digest hmacSha256(std::string_view key, std::string_view message);
// Compares in time independent of where they differ.
bool equalDigests(const Digest& a, const Digest& b);
std::string_view asBytes(const Digest& d);

}  // namespace drun::crypto

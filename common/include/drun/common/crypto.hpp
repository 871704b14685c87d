// The few cryptographic primitives drun needs, bound to OpenSSL's libcrypto: SHA-256 (the store
// keeps a digest of a watcher's known value instead of the value), HMAC-SHA256 (the store's
// challenge-response), random bytes (its nonces) and a constant-time comparison (its proofs).
//
// Threading: Sha256 is a value (one per thread); the functions are thread-safe. Every function
// throws drun::Error when libcrypto reports a failure (it does not for these inputs in practice).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

namespace drun::crypto {

using Digest = std::array<uint8_t, 32>;

// Incremental SHA-256 (FIPS 180-4).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  void update(std::string_view data);
  Digest finish();  // the object is spent afterwards

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

Digest sha256(std::string_view data);
Digest hmacSha256(std::string_view key, std::string_view message);  // RFC 2104
// Compares in time independent of where they differ (CRYPTO_memcmp).
bool equalDigests(const Digest& a, const Digest& b);
// Fills `out` from the operating system's generator via RAND_bytes.
void randomBytes(uint8_t* out, size_t size);
std::string_view asBytes(const Digest& d);

}  // namespace drun::crypto

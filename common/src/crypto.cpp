// libcrypto (OpenSSL 3) bindings of crypto.hpp: EVP for SHA-256, HMAC() for HMAC-SHA256,
// RAND_bytes, CRYPTO_memcmp. The FIPS 180-2 and RFC 4231 vectors (common/tests/crypto_test.cpp)
// check the binding.
#include "drun/common/crypto.hpp"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <climits>
#include <string>

#include "drun/common/error.hpp"

namespace drun::crypto {
namespace {

// libcrypto is initialised once, without its atexit cleanup: threads that use it (the store
// server's io thread) may end during static destruction, after that cleanup would have run, and
// their thread-local state would leak. Its memory is given back at process exit anyway.
void initialise() {
  static const bool done = OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr) == 1;
  (void)done;
}

[[noreturn]] void fail(const char* what) {
  char text[256] = {};
  ERR_error_string_n(ERR_get_error(), text, sizeof text);
  throw Error(std::string("libcrypto: ") + what + " failed: " + text);
}

}  // namespace

struct Sha256::Context {
  EVP_MD_CTX* md = nullptr;
  ~Context() { EVP_MD_CTX_free(md); }
};

Sha256::Sha256() : context_(std::make_unique<Context>()) {
  initialise();
  context_->md = EVP_MD_CTX_new();
  if (!context_->md || EVP_DigestInit_ex(context_->md, EVP_sha256(), nullptr) != 1)
    fail("SHA-256 init");
}

Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::update(std::string_view data) {
  if (EVP_DigestUpdate(context_->md, data.data(), data.size()) != 1) fail("SHA-256 update");
}

Digest Sha256::finish() {
  Digest out{};
  unsigned int size = 0;
  if (EVP_DigestFinal_ex(context_->md, out.data(), &size) != 1 || size != out.size())
    fail("SHA-256 final");
  return out;
}

Digest sha256(std::string_view data) {
  Sha256 s;
  s.update(data);
  return s.finish();
}

Digest hmacSha256(std::string_view key, std::string_view message) {
  initialise();
  if (key.size() > INT_MAX) throw Error("libcrypto: HMAC key too long");
  Digest out{};
  unsigned int size = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(message.data()), message.size(), out.data(),
            &size) ||
      size != out.size())
    fail("HMAC-SHA256");
  return out;
}

bool equalDigests(const Digest& a, const Digest& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

void randomBytes(uint8_t* out, size_t size) {
  initialise();
  while (size > 0) {
    const int chunk = static_cast<int>(std::min<size_t>(size, 1 << 20));
    if (RAND_bytes(out, chunk) != 1) fail("RAND_bytes");
    out += chunk;
    size -= static_cast<size_t>(chunk);
  }
}

std::string_view asBytes(const Digest& d) {
  return {reinterpret_cast<const char*>(d.data()), d.size()};
}

}  // namespace drun::crypto

// The libcrypto binding (crypto.hpp): SHA-256 against FIPS 180-2 (appendix B), HMAC-SHA256
// against RFC 4231, random bytes, the constant-time comparison.
#include <catch2/catch.hpp>

#include <string>

#include "drun/common/crypto.hpp"

using namespace drun::crypto;

namespace {

std::string hex(const Digest& d) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : d) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

std::string unhex(std::string_view h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(std::string(h.substr(i, 2)), nullptr, 16)));
  return out;
}

}  // namespace

TEST_CASE("sha256: FIPS 180-2 test vectors", "[crypto]") {
  CHECK(hex(sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex(sha256("")) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a', fed in uneven pieces (the block buffering across updates).
  Sha256 s;
  std::string piece(997, 'a');
  size_t left = 1'000'000;
  while (left > 0) {
    size_t n = std::min(left, piece.size());
    s.update(std::string_view(piece.data(), n));
    left -= n;
  }
  CHECK(hex(s.finish()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Lengths around the padding boundary (55, 56, 63, 64 bytes) agree with one-shot hashing.
  for (size_t n : {55u, 56u, 63u, 64u, 65u}) {
    std::string m(n, 'x');
    Sha256 split;
    split.update(m.substr(0, n / 2));
    split.update(m.substr(n / 2));
    CHECK(split.finish() == sha256(m));
  }
}

TEST_CASE("hmac-sha256: RFC 4231 test cases", "[crypto]") {
  // Case 1
  CHECK(hex(hmacSha256(std::string(20, '\x0b'), "Hi There")) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Case 2
  CHECK(hex(hmacSha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Case 3
  CHECK(hex(hmacSha256(std::string(20, '\xaa'), std::string(50, '\xdd'))) ==
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  // Case 4
  CHECK(hex(hmacSha256(unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"),
                       std::string(50, '\xcd'))) ==
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  // Case 6: a key longer than the block is hashed first
  CHECK(hex(hmacSha256(std::string(131, '\xaa'),
                       "Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  // Case 7
  CHECK(hex(hmacSha256(std::string(131, '\xaa'),
                       "This is a test using a larger than block-size key and a larger than "
                       "block-size data. The key needs to be hashed before being used by the "
                       "HMAC algorithm.")) ==
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST_CASE("hmac-sha256: digests compare equal only when equal", "[crypto]") {
  Digest a = hmacSha256("key", "m");
  Digest b = a;
  CHECK(equalDigests(a, b));
  b[31] ^= 1;
  CHECK_FALSE(equalDigests(a, b));
  CHECK_FALSE(equalDigests(a, hmacSha256("key2", "m")));
}

TEST_CASE("random bytes: two draws differ and fill the whole buffer", "[crypto]") {
  std::array<uint8_t, 64> a{}, b{};
  randomBytes(a.data(), a.size());
  randomBytes(b.data(), b.size());
  CHECK(a != b);
  // 64 zero bytes from a working generator: probability 2^-512.
  CHECK(a != std::array<uint8_t, 64>{});
}

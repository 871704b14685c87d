// The connection handshake (protocol.hpp's top comment has its layout): Hello and HelloReply,
// the HMAC-SHA256 proofs of the shared token, Auth and AuthReply, and the nonces they carry.
#include <algorithm>

#include "drun/common/crypto.hpp"
#include "drun/common/error.hpp"
#include "drun/store/protocol.hpp"
#include "wire_bytes.hpp"

namespace drun::rdzv::wire {
namespace {

using detail::Reader;
using detail::Writer;

// Whether the bytes received so far agree with the magic: a foreign peer is rejected as soon as
// its first bytes differ, without waiting for a whole hello.
bool magicSoFar(std::string_view in) {
  for (size_t i = 0; i < std::min<size_t>(in.size(), 4); ++i)
    if (static_cast<unsigned char>(in[i]) != ((kMagic >> (8 * i)) & 0xff)) return false;
  return true;
}

// Hello and HelloReply share one 12-byte layout: magic, u16 version, u16 word (the client's
// flags / the server's status), u32 lease.
struct HelloLayout {
  uint16_t version = 0;
  uint16_t word = 0;
  uint32_t leaseMs = 0;
};

DecodeResult decodeHelloLayout(std::string_view in, const char* peer, const char* wordName,
                               uint16_t maxWord, HelloLayout& h) {
  DecodeResult r;
  if (!magicSoFar(in)) {
    r.status = DecodeStatus::Bad;
    r.error = std::string("not a drun store ") + peer + " (bad magic)";
    return r;
  }
  if (in.size() < kHelloBytes) return r;
  Reader rd(in.substr(0, kHelloBytes));
  rd.u32("magic");
  h.version = rd.u16("version");
  h.word = rd.u16(wordName);
  h.leaseMs = rd.u32("lease");
  if (h.word > maxWord) {
    r.status = DecodeStatus::Bad;
    r.error = std::string("unknown ") + wordName + " " + std::to_string(h.word);
    return r;
  }
  r.status = DecodeStatus::Ok;
  r.consumed = kHelloBytes;
  return r;
}

template <size_t N>
void readArray(std::string_view in, std::array<uint8_t, N>& out) {
  for (size_t i = 0; i < N; ++i) out[i] = static_cast<uint8_t>(in[i]);
}

}  // namespace

void encodeHello(const Hello& hello, std::string& out) {
  if (hello.scope.size() > kMaxScopeBytes)
    throw InvalidArgument("hello scope of " + std::to_string(hello.scope.size()) +
                          " bytes is over the limit of " + std::to_string(kMaxScopeBytes));
  Writer w(out);
  w.u32(kMagic);
  w.u16(hello.version);
  w.u16(0);
  w.u32(hello.leaseMs);
  if (hello.version != kVersion) return;  // a test playing an old client
  out.append(reinterpret_cast<const char*>(hello.nonce.data()), kNonceBytes);
  w.bytes(hello.scope);
}

void encodeHelloReply(const HelloReply& reply, std::string& out) {
  Writer w(out);
  w.u32(kMagic);
  w.u16(reply.version);
  w.u16(static_cast<uint16_t>(reply.status));
  w.u32(reply.leaseMs);
  if (reply.status != HelloStatus::Ok || reply.version != kVersion) return;
  out.append(reinterpret_cast<const char*>(reply.nonce.data()), kNonceBytes);
  w.u8(reply.tokenRequired ? 1 : 0);
}

void encodeAuth(const Mac& mac, std::string& out) {
  out.append(reinterpret_cast<const char*>(mac.data()), kMacBytes);
}

void encodeAuthReply(const AuthReply& reply, std::string& out) {
  Writer w(out);
  w.u8(static_cast<uint8_t>(reply.status));
  out.append(reinterpret_cast<const char*>(reply.mac.data()), kMacBytes);
}

DecodeResult decodeHello(std::string_view in, Hello& out) {
  HelloLayout h;
  DecodeResult r = decodeHelloLayout(in, "client", "hello flags", 0, h);
  out.version = h.version;
  out.leaseMs = h.leaseMs;
  if (r.status != DecodeStatus::Ok || h.version != kVersion) return r;
  // This version's tail: nonce, scope.
  constexpr size_t kFixed = kHelloBytes + kNonceBytes + 4;
  if (in.size() < kFixed) {
    r.status = DecodeStatus::NeedMore;
    r.consumed = 0;
    r.needed = kFixed;
    return r;
  }
  readArray(in.substr(kHelloBytes), out.nonce);
  Reader rd(in.substr(kHelloBytes + kNonceBytes, 4));
  const uint32_t scopeBytes = rd.u32("scope length");
  if (scopeBytes > kMaxScopeBytes) {
    r.status = DecodeStatus::Bad;
    r.consumed = 0;
    r.error = "hello scope of " + std::to_string(scopeBytes) + " bytes is over the limit of " +
              std::to_string(kMaxScopeBytes);
    return r;
  }
  if (in.size() < kFixed + scopeBytes) {
    r.status = DecodeStatus::NeedMore;
    r.consumed = 0;
    r.needed = kFixed + scopeBytes;
    return r;
  }
  out.scope = std::string(in.substr(kFixed, scopeBytes));
  r.consumed = kFixed + scopeBytes;
  return r;
}

DecodeResult decodeHelloReply(std::string_view in, HelloReply& out) {
  HelloLayout h;
  DecodeResult r =
      decodeHelloLayout(in, "server", "hello status", static_cast<uint16_t>(HelloStatus::Busy), h);
  out.version = h.version;
  out.status = static_cast<HelloStatus>(h.word);
  out.leaseMs = h.leaseMs;
  if (r.status != DecodeStatus::Ok || out.status != HelloStatus::Ok || h.version != kVersion)
    return r;
  constexpr size_t kFull = kHelloBytes + kNonceBytes + 1;
  if (in.size() < kFull) {
    r.status = DecodeStatus::NeedMore;
    r.consumed = 0;
    r.needed = kFull;
    return r;
  }
  readArray(in.substr(kHelloBytes), out.nonce);
  const auto required = static_cast<uint8_t>(in[kHelloBytes + kNonceBytes]);
  if (required > 1) {
    r.status = DecodeStatus::Bad;
    r.consumed = 0;
    r.error = "token-required flag is " + std::to_string(required) + ", not 0 or 1";
    return r;
  }
  out.tokenRequired = required == 1;
  r.consumed = kFull;
  return r;
}

DecodeResult decodeAuth(std::string_view in, Mac& out) {
  DecodeResult r;
  if (in.size() < kMacBytes) {
    r.needed = kMacBytes;
    return r;
  }
  readArray(in, out);
  r.status = DecodeStatus::Ok;
  r.consumed = kMacBytes;
  return r;
}

DecodeResult decodeAuthReply(std::string_view in, AuthReply& out) {
  DecodeResult r;
  if (in.size() < kAuthReplyBytes) {
    r.needed = kAuthReplyBytes;
    return r;
  }
  const auto status = static_cast<uint8_t>(in[0]);
  if (status > static_cast<uint8_t>(AuthStatus::Refused)) {
    r.status = DecodeStatus::Bad;
    r.error = "unknown auth status " + std::to_string(status);
    return r;
  }
  out.status = static_cast<AuthStatus>(status);
  readArray(in.substr(1), out.mac);
  r.status = DecodeStatus::Ok;
  r.consumed = kAuthReplyBytes;
  return r;
}

namespace {

Mac proof(std::string_view label, std::string_view token, const Nonce& first,
          const Nonce& second, std::string_view scope) {
  std::string message(label);
  message.push_back('\0');
  message.append(reinterpret_cast<const char*>(first.data()), first.size());
  message.append(reinterpret_cast<const char*>(second.data()), second.size());
  message.append(scope);
  return crypto::hmacSha256(token, message);
}

}  // namespace

Mac clientProof(std::string_view token, const Nonce& client, const Nonce& server,
                std::string_view scope) {
  return proof("drun store v2 client", token, server, client, scope);
}

Mac serverProof(std::string_view token, const Nonce& client, const Nonce& server,
                std::string_view scope) {
  return proof("drun store v2 server", token, client, server, scope);
}

bool equalMacs(const Mac& a, const Mac& b) { return crypto::equalDigests(a, b); }

Nonce randomNonce() {
  Nonce n;
  crypto::randomBytes(n.data(), n.size());
  return n;
}
}  // namespace drun::rdzv::wire

// The wire codec's handshake messages: the hello and its reply, version 2's nonces and scope, and
// the token challenge.
#include <catch2/catch.hpp>

#include <cstring>

#include "drun/common/error.hpp"
#include "drun/store/protocol.hpp"

using namespace drun::rdzv;
using namespace drun::rdzv::wire;

TEST_CASE("protocol: hello and its reply", "[protocol]") {
  std::string bytes;
  encodeHello(Hello{kVersion, 5000}, bytes);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    Hello h;
    REQUIRE(decodeHello(std::string_view(bytes).substr(0, cut), h).status ==
            DecodeStatus::NeedMore);
  }
  Hello h;
  REQUIRE(decodeHello(bytes, h).status == DecodeStatus::Ok);
  CHECK(h.version == kVersion);
  CHECK(h.leaseMs == 5000);

  std::string reply;
  encodeHelloReply(HelloReply{7, HelloStatus::VersionMismatch, 0}, reply);
  HelloReply r;
  REQUIRE(decodeHelloReply(reply, r).status == DecodeStatus::Ok);
  CHECK(r.version == 7);
  CHECK(r.status == HelloStatus::VersionMismatch);

  // A foreign peer is refused at its first wrong byte (an HTTP request, torch's handshake).
  CHECK(decodeHello("G", h).status == DecodeStatus::Bad);
  CHECK(decodeHello(std::string("\x00\xce\xf7\x85\x3c", 5), h).status == DecodeStatus::Bad);
  CHECK(decodeHelloReply("HTTP/1.1 400", r).status == DecodeStatus::Bad);
  std::string flagged = bytes;
  flagged[6] = 1;
  CHECK(decodeHello(flagged, h).status == DecodeStatus::Bad);
  std::string badStatus = reply;
  badStatus[6] = 9;
  CHECK(decodeHelloReply(badStatus, r).status == DecodeStatus::Bad);
}

TEST_CASE("protocol: version 2 hello carries nonces and the scope, and the token challenge",
          "[protocol]") {
  Hello hello;
  hello.leaseMs = 7000;
  hello.nonce = randomNonce();
  hello.scope = "job7";
  std::string bytes;
  encodeHello(hello, bytes);
  CHECK(bytes.size() == kHelloBytes + kNonceBytes + 4 + 4);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    Hello h;
    REQUIRE(decodeHello(std::string_view(bytes).substr(0, cut), h).status ==
            DecodeStatus::NeedMore);
  }
  Hello h;
  auto r = decodeHello(bytes + "next", h);
  REQUIRE(r.status == DecodeStatus::Ok);
  CHECK(r.consumed == bytes.size());
  CHECK(h.nonce == hello.nonce);
  CHECK(h.scope == "job7");
  CHECK(h.leaseMs == 7000);
  CHECK(randomNonce() != randomNonce());

  // An old client's 12-byte hello decodes (version 1) so the server can say VersionMismatch.
  std::string old("drun\x01\x00\x00\x00\x00\x00\x00\x00", 12);
  REQUIRE(decodeHello(old, h).status == DecodeStatus::Ok);
  CHECK(h.version == 1);
  // A scope over the limit is refused from its length.
  std::string longScope = bytes.substr(0, kHelloBytes + kNonceBytes) + std::string("\xff\x00\x00\x00", 4);
  CHECK(decodeHello(longScope, h).status == DecodeStatus::Bad);
  hello.scope = std::string(kMaxScopeBytes + 1, 'j');
  std::string unused;
  CHECK_THROWS_AS(encodeHello(hello, unused), drun::InvalidArgument);

  HelloReply reply;
  reply.leaseMs = 5000;
  reply.nonce = randomNonce();
  reply.tokenRequired = true;
  std::string replyBytes;
  encodeHelloReply(reply, replyBytes);
  CHECK(replyBytes.size() == kHelloBytes + kNonceBytes + 1);
  HelloReply back;
  REQUIRE(decodeHelloReply(std::string_view(replyBytes).substr(0, kHelloBytes + 3), back).status ==
          DecodeStatus::NeedMore);
  REQUIRE(decodeHelloReply(replyBytes, back).status == DecodeStatus::Ok);
  CHECK(back.tokenRequired);
  CHECK(back.nonce == reply.nonce);
  // A refusal is the shared 12 bytes alone.
  std::string busy;
  encodeHelloReply(HelloReply{kVersion, HelloStatus::Busy, 0}, busy);
  CHECK(busy.size() == kHelloBytes);
  REQUIRE(decodeHelloReply(busy, back).status == DecodeStatus::Ok);
  CHECK(back.status == HelloStatus::Busy);

  // The proofs: each side's differs (no reflection), and depends on the token, nonces, scope.
  const std::string token = "0123456789abcdef-secret";
  Mac client = clientProof(token, hello.nonce, reply.nonce, "job7");
  CHECK(client != serverProof(token, hello.nonce, reply.nonce, "job7"));
  CHECK(client != clientProof(token + "x", hello.nonce, reply.nonce, "job7"));
  CHECK(client != clientProof(token, reply.nonce, hello.nonce, "job7"));
  CHECK(client != clientProof(token, hello.nonce, reply.nonce, "job8"));
  CHECK(equalMacs(client, clientProof(token, hello.nonce, reply.nonce, "job7")));
  std::string auth;
  encodeAuth(client, auth);
  Mac mac{};
  CHECK(decodeAuth(std::string_view(auth).substr(0, 31), mac).status == DecodeStatus::NeedMore);
  REQUIRE(decodeAuth(auth, mac).status == DecodeStatus::Ok);
  CHECK(mac == client);
  std::string verdict;
  encodeAuthReply(AuthReply{AuthStatus::Refused, {}}, verdict);
  AuthReply v;
  REQUIRE(decodeAuthReply(verdict, v).status == DecodeStatus::Ok);
  CHECK(v.status == AuthStatus::Refused);
  verdict[0] = 7;
  CHECK(decodeAuthReply(verdict, v).status == DecodeStatus::Bad);
}

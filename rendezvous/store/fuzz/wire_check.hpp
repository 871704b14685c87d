// What the wire fuzzer checks on one input, shared by the libFuzzer target (wire_fuzz.cpp, built
// with -DDRUN_FUZZ=ON) and the corpus replay test (rendezvous/store/tests/wire_corpus_test.cpp), so a
// crash found once stays a regression test in every build.
//
// The input is an arbitrary byte stream as a peer could send it. Each decoder must answer
// NeedMore, Ok or Bad without reading past the input or allocating for a claimed length; an Ok
// message must re-encode to bytes that decode to the same message (the codec agrees with
// itself), and a stream fed in pieces through a ReceiveBuffer decodes like the whole.
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>

#include "drun/common/error.hpp"
#include "drun/store/protocol.hpp"
#include "../../../tests/support/fuzz_support.hpp"

namespace drun::rdzv::fuzz {

inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "wire fuzz: invariant broken: %s\n", what);
    std::abort();
  }
}

inline void checkResult(const wire::DecodeResult& r, size_t size) {
  require(r.status != wire::DecodeStatus::Ok || (r.consumed > 0 && r.consumed <= size),
          "Ok consumed a size within the input");
  require(r.status != wire::DecodeStatus::Bad || !r.error.empty(), "Bad says why");
}

// Decodes requests off the front of `in` until NeedMore or Bad; each Ok one round-trips.
inline size_t requests(std::string_view in, size_t maxMessages = 64) {
  size_t decoded = 0;
  while (decoded < maxMessages) {
    wire::Request q;
    auto r = wire::decodeRequest(in, q);
    checkResult(r, in.size());
    if (r.status != wire::DecodeStatus::Ok) break;
    std::string again;
    try {
      wire::encodeRequest(q, again);
    } catch (const InvalidArgument&) {
      require(false, "a decoded request encodes");
    }
    wire::Request back;
    require(wire::decodeRequest(again, back).status == wire::DecodeStatus::Ok,
            "a re-encoded request decodes");
    std::string third;
    wire::encodeRequest(back, third);
    require(third == again, "request round trip is stable");
    in.remove_prefix(r.consumed);
    ++decoded;
  }
  return decoded;
}

inline void responses(std::string_view in) {
  for (int i = 0; i < 64; ++i) {
    wire::Response p;
    auto r = wire::decodeResponse(in, p);
    checkResult(r, in.size());
    if (r.status != wire::DecodeStatus::Ok) return;
    std::string again;
    try {
      wire::encodeResponse(p, again);
    } catch (const InvalidArgument&) {
      return;  // e.g. a message over maxMessageBytes is cut on encoding: fine, not a round trip
    }
    wire::Response back;
    require(wire::decodeResponse(again, back).status == wire::DecodeStatus::Ok,
            "a re-encoded response decodes");
    in.remove_prefix(r.consumed);
  }
}

inline void checkWireInput(std::string_view data) {
  // The first byte picks what the rest is fed to, so one corpus covers every decoder.
  if (data.empty()) return;
  const unsigned char selector = static_cast<unsigned char>(data[0]);
  std::string_view in = data.substr(1);
  switch (selector % 5) {
    case 0: {
      wire::Hello h;
      checkResult(wire::decodeHello(in, h), in.size());
      wire::HelloReply hr;
      checkResult(wire::decodeHelloReply(in, hr), in.size());
      break;
    }
    case 1: {
      wire::Mac mac{};
      checkResult(wire::decodeAuth(in, mac), in.size());
      wire::AuthReply ar;
      checkResult(wire::decodeAuthReply(in, ar), in.size());
      break;
    }
    case 2:
      requests(in);
      break;
    case 3:
      responses(in);
      break;
    case 4: {
      // The same stream whole and in pieces of (selector / 5 + 1) bytes through a ReceiveBuffer.
      const size_t whole = requests(in);
      const size_t piece = selector / 5 + 1;
      wire::ReceiveBuffer buffer;
      size_t decoded = 0;
      bool bad = false;
      for (size_t at = 0; at < in.size() && !bad && decoded < whole; at += piece) {
        size_t n = std::min(piece, in.size() - at);
        std::copy_n(in.data() + at, n, buffer.prepare(n));
        buffer.commit(n);
        for (;;) {
          wire::Request q;
          auto r = wire::decodeRequest(buffer.data(), q);
          if (r.status == wire::DecodeStatus::Bad) bad = true;
          if (r.status != wire::DecodeStatus::Ok) break;
          buffer.consume(r.consumed);
          ++decoded;
        }
      }
      require(decoded == whole, "pieces decode the same requests as the whole");
      break;
    }
  }
}

}  // namespace drun::rdzv::fuzz

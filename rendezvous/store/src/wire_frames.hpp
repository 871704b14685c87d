// Frames, the unit after the handshake (protocol.hpp's top comment has the layout): writing a
// header and patching its length, reading and checking a header, and the limits an encoder
// enforces. Shared by the request codec (protocol_requests.cpp) and the response codec
// (protocol.cpp). Private to the store library.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "drun/store/protocol.hpp"
#include "wire_bytes.hpp"

namespace drun::rdzv::wire::detail {

// Limits on the encoding side: the caller learns about them as InvalidArgument.
void checkKey(const std::string& key, const Limits& l);
void checkValue(const std::string& key, const Bytes& v, const Limits& l);
void checkCount(size_t n, const Limits& l);
void checkKeys(const std::vector<std::string>& keys, const Limits& l);

// Appends a header with a zero length and returns where it starts; endFrame patches the length,
// or removes the frame and throws InvalidArgument when the body is over the frame limit.
size_t beginFrame(Writer& w, Op op, Status status, uint64_t id);
void endFrame(Writer& w, std::string& out, size_t at, const Limits& l);

struct Header {
  uint32_t length = 0;
  uint8_t op = 0;
  uint8_t status = 0;
  uint64_t id = 0;
};

// Reads and checks a frame header; NeedMore until the whole frame is present.
DecodeResult frame(std::string_view in, const Limits& l, Header& h, std::string_view& body);
// A decode's end: Bad when the reader failed or bytes are left after the body.
DecodeResult finish(DecodeResult r, const Reader& rd);

}  // namespace drun::rdzv::wire::detail

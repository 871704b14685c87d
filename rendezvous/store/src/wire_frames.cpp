#include "wire_frames.hpp"

#include "drun/common/error.hpp"

namespace drun::rdzv::wire::detail {

void checkKey(const std::string& key, const Limits& l) { checkKeyLimit(key, l.store); }
void checkValue(const std::string& key, const Bytes& v, const Limits& l) {
  checkValueLimit(key, v, l.store);
}
void checkCount(size_t n, const Limits& l) { checkKeyCountLimit(n, l.store); }
void checkKeys(const std::vector<std::string>& keys, const Limits& l) {
  checkCount(keys.size(), l);
  for (const auto& k : keys) checkKey(k, l);
}

size_t beginFrame(Writer& w, Op op, Status status, uint64_t id) {
  size_t at = w.size();
  w.u32(0);  // body length, patched by endFrame
  w.u8(static_cast<uint8_t>(op));
  w.u8(static_cast<uint8_t>(status));
  w.u16(0);
  w.u64(id);
  return at;
}

void endFrame(Writer& w, std::string& out, size_t at, const Limits& l) {
  size_t body = w.size() - at - kHeaderBytes;
  if (body > l.maxFrameBytes) {
    out.resize(at);
    throw InvalidArgument("message of " + std::to_string(body) +
                          " bytes is over the frame limit of " + std::to_string(l.maxFrameBytes));
  }
  w.patchU32(at, static_cast<uint32_t>(body));
}

DecodeResult frame(std::string_view in, const Limits& l, Header& h, std::string_view& body) {
  DecodeResult r;
  if (in.size() < kHeaderBytes) return r;
  Reader hr(in.substr(0, kHeaderBytes));
  h.length = hr.u32("frame length");
  h.op = hr.u8("op");
  h.status = hr.u8("status");
  uint16_t reserved = hr.u16("reserved");
  h.id = hr.u64("request id");
  r.status = DecodeStatus::Bad;
  if (h.length > l.maxFrameBytes) {
    r.error = "frame of " + std::to_string(h.length) + " bytes is over the limit of " +
              std::to_string(l.maxFrameBytes);
    return r;
  }
  if (!isValidOp(h.op)) {
    r.error = "unknown op " + std::to_string(h.op);
    return r;
  }
  if (h.status > kMaxStatus) {
    r.error = "unknown status " + std::to_string(h.status);
    return r;
  }
  if (reserved != 0) {
    r.error = "reserved header bits set";
    return r;
  }
  if (in.size() - kHeaderBytes < h.length) {
    r.status = DecodeStatus::NeedMore;
    r.needed = kHeaderBytes + h.length;
    return r;
  }
  body = in.substr(kHeaderBytes, h.length);
  r.status = DecodeStatus::Ok;
  r.consumed = kHeaderBytes + h.length;
  return r;
}

DecodeResult finish(DecodeResult r, const Reader& rd) {
  if (!rd.ok()) {
    r.status = DecodeStatus::Bad;
    r.error = rd.error();
  } else if (rd.left() != 0) {
    r.status = DecodeStatus::Bad;
    r.error = std::to_string(rd.left()) + " unexpected bytes after the body";
  }
  if (r.status == DecodeStatus::Bad) r.consumed = 0;
  return r;
}

}  // namespace drun::rdzv::wire::detail

// The wire's byte level, shared by the handshake (protocol_handshake.cpp) and the frame codec
// (protocol.cpp): explicit little-endian writing, and bounds-checked reading whose first failure
// sticks and names itself. Private to the store library.
// Threading: one object per message being written or read.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace drun::rdzv::wire::detail {

class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u16(uint16_t v) { le(v, 2); }
  void u32(uint32_t v) { le(v, 4); }
  void u64(uint64_t v) { le(v, 8); }
  void i64(int64_t v) { le(static_cast<uint64_t>(v), 8); }
  void bytes(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  void strings(const std::vector<std::string>& list) {
    u32(static_cast<uint32_t>(list.size()));
    for (const auto& s : list) bytes(s);
  }
  size_t size() const { return out_.size(); }
  void patchU32(size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) out_[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  }

 private:
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string& out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  size_t left() const { return in_.size() - pos_; }
  void fail(std::string why) {
    if (error_.empty()) error_ = std::move(why);
  }

  uint64_t le(int n, const char* what) {
    if (!ok()) return 0;
    if (left() < static_cast<size_t>(n)) {
      fail(std::string("truncated ") + what);
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < n; ++i)
      v |= static_cast<uint64_t>(static_cast<unsigned char>(in_[pos_ + i])) << (8 * i);
    pos_ += n;
    return v;
  }
  uint8_t u8(const char* what) { return static_cast<uint8_t>(le(1, what)); }
  uint16_t u16(const char* what) { return static_cast<uint16_t>(le(2, what)); }
  uint32_t u32(const char* what) { return static_cast<uint32_t>(le(4, what)); }
  uint64_t u64(const char* what) { return le(8, what); }
  int64_t i64(const char* what) { return static_cast<int64_t>(le(8, what)); }
  bool flag(const char* what) {
    uint8_t v = u8(what);
    if (v > 1) fail(std::string(what) + " is " + std::to_string(v) + ", not 0 or 1");
    return v == 1;
  }
  std::string bytes(size_t max, const char* what) {
    uint32_t n = u32(what);
    if (!ok()) return {};
    if (n > max) {
      fail(std::string(what) + " of " + std::to_string(n) + " bytes is over the limit of " +
           std::to_string(max));
      return {};
    }
    if (n > left()) {
      fail(std::string(what) + " of " + std::to_string(n) + " bytes runs past the frame");
      return {};
    }
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  // A list count, checked against the limit and against the bytes left (each item takes at
  // least `minItemBytes`), before anything is reserved for it.
  uint32_t count(size_t max, size_t minItemBytes, const char* what) {
    uint32_t n = u32(what);
    if (!ok()) return 0;
    if (n > max) {
      fail(std::string(what) + " " + std::to_string(n) + " is over the limit of " +
           std::to_string(max));
      return 0;
    }
    if (static_cast<uint64_t>(n) * minItemBytes > left()) {
      fail(std::string(what) + " " + std::to_string(n) + " runs past the frame");
      return 0;
    }
    return n;
  }
  std::vector<std::string> strings(size_t maxCount, size_t maxEach, const char* what) {
    uint32_t n = count(maxCount, 4, what);
    std::vector<std::string> out;
    out.reserve(n);
    for (uint32_t i = 0; i < n && ok(); ++i) out.push_back(bytes(maxEach, what));
    return out;
  }

 private:
  std::string_view in_;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace drun::rdzv::wire::detail

#include "drun/common/safe_text.hpp"

#include <cstdint>

namespace drun::text {
namespace {

// Length of the valid UTF-8 sequence at the front of `in` (0 = invalid) and its code point.
size_t utf8Sequence(std::string_view in, uint32_t& cp) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(in[i]); };
  const unsigned char lead = b(0);
  size_t n = lead >= 0xF0 && lead <= 0xF4 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC2 ? 2 : 0;
  if (lead >= 0xF5) n = 0;
  if (n == 0 || in.size() < n) return 0;
  cp = lead & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) {
    if ((b(i) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i) & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not text.
  static constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinForLength[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

// C1 controls (a terminal may take U+009B for CSI) and the bidirectional overrides and isolates
// that make text display in another order than it reads.
bool isControl(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069) || cp == 0x200E || cp == 0x200F;
}

}  // namespace

std::string printable(std::string_view in, const SafeTextOptions& options) {
  std::string out;
  out.reserve(std::min(in.size(), options.maxBytes));
  size_t i = 0;
  while (i < in.size()) {
    const unsigned char c = static_cast<unsigned char>(in[i]);
    std::string_view piece;
    char replacement = 0;
    size_t used = 1;
    if (c >= 0x20 && c < 0x7F) {
      piece = in.substr(i, 1);
    } else if (c == '\n') {
      replacement = options.multiLine ? '\n' : ' ';
    } else if (c == '\t') {
      replacement = options.multiLine ? '\t' : ' ';
    } else if (c == '\r') {
      i += 1;  // would move the cursor back over what was printed
      continue;
    } else if (c < 0x80) {
      replacement = '?';  // ESC, BEL, backspace, DEL and the other C0 controls
    } else {
      uint32_t cp = 0;
      size_t n = utf8Sequence(in.substr(i), cp);
      if (n == 0 || isControl(cp)) {
        replacement = '?';
        used = n == 0 ? 1 : n;
      } else {
        piece = in.substr(i, n);
        used = n;
      }
    }
    const size_t size = replacement ? 1 : piece.size();
    if (out.size() + size > options.maxBytes) break;
    if (replacement) {
      out.push_back(replacement);
    } else {
      out.append(piece);
    }
    i += used;
  }
  if (i < in.size()) out += " ... (" + std::to_string(in.size() - i) + " more bytes)";
  return out;
}

}  // namespace drun::text

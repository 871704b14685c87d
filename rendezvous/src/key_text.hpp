// The key scheme's text helpers, shared by the key names (keys.cpp), the value codecs
// (key_values.cpp) and the host lists (host_list.cpp): field limits, tab-separated fields,
// strict integers. Private to drun_rendezvous.
#pragma once

#include <charconv>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace drun::rdzv::keys::detail {

constexpr size_t kMaxField = 255;
// NodeDescriptor::displayName(): "host(addr)", each a plain field.
constexpr size_t kMaxName = 2 * kMaxField + 2;
constexpr int kMaxLocalWorldSize = 1 << 20;
constexpr int kMaxNodeRank = 1 << 20;
// A round has at most one node per possible node rank; a state claiming more is corrupt (and
// would make its readers allocate per claimed node).
constexpr int kMaxNodes = kMaxNodeRank + 1;

inline std::string cat(std::string_view a, std::string_view b) {
  std::string s;
  s.reserve(a.size() + b.size());
  s.append(a).append(b);
  return s;
}

// Splits on '\t'; keeps empty fields.
inline std::vector<std::string_view> splitTabs(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    size_t tab = s.find('\t', start);
    if (tab == std::string_view::npos) {
      out.push_back(s.substr(start));
      return out;
    }
    out.push_back(s.substr(start, tab - start));
    start = tab + 1;
  }
}

template <typename Int>
std::optional<Int> parseInt(std::string_view s) {
  Int v{};
  if (s.empty()) return std::nullopt;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

inline bool isPlainField(std::string_view s, size_t maxSize = kMaxField) {
  if (s.empty() || s.size() > maxSize) return false;
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f) return false;  // tabs, newlines and other controls
  return true;
}

// A round's error text is told to every joiner and printed: one bounded, printable line.
constexpr size_t kMaxStateError = 4096;

}  // namespace drun::rdzv::keys::detail

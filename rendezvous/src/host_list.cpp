// A round's host list, folded as SLURM folds node names ("node[01-04]") and parsed back.
#include "drun/rendezvous/keys.hpp"

#include "drun/common/error.hpp"
#include "drun/common/safe_text.hpp"
#include "key_text.hpp"

namespace drun::rdzv::keys {

using namespace detail;

namespace {

// The largest first number of a folded run parseHostList accepts; the encoder folds only names
// within it, so everything it writes parses back (a fuzz-found disagreement: a 17-digit number).
constexpr int64_t kMaxRunStart = int64_t{1} << 53;

// A name split around its last run of digits (at most 18: fits an int64).
struct Numbered {
  std::string_view prefix, digits, suffix;
  int64_t number = 0;
  int width = 0;  // zero-padded width, 0 = not padded
};

std::optional<Numbered> splitNumber(std::string_view name) {
  size_t end = name.find_last_of("0123456789");
  if (end == std::string_view::npos) return std::nullopt;
  size_t begin = end;
  while (begin > 0 && name[begin - 1] >= '0' && name[begin - 1] <= '9') --begin;
  Numbered n;
  n.prefix = name.substr(0, begin);
  n.digits = name.substr(begin, end + 1 - begin);
  n.suffix = name.substr(end + 1);
  if (n.digits.size() > 18) return std::nullopt;
  n.number = *parseInt<int64_t>(n.digits);
  if (n.number > kMaxRunStart) return std::nullopt;  // written as a plain "=" line instead
  n.width = n.digits.size() > 1 && n.digits[0] == '0' ? static_cast<int>(n.digits.size()) : 0;
  return n;
}

std::string formatNumber(int64_t number, int width) {
  std::string digits = std::to_string(number);
  if (static_cast<int>(digits.size()) < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

}  // namespace

std::string encodeHostList(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size();) {
    auto first = splitNumber(names[i]);
    size_t count = 1;
    if (first) {
      while (i + count < names.size()) {
        auto next = splitNumber(names[i + count]);
        if (!next || next->prefix != first->prefix || next->suffix != first->suffix ||
            next->digits != formatNumber(first->number + static_cast<int64_t>(count), first->width))
          break;
        ++count;
      }
    }
    if (count == 1) {
      out.append("=").append(names[i]).append("\n");
    } else {
      out.append("~").append(first->prefix).append("\t").append(std::to_string(first->number));
      out.append("\t").append(std::to_string(count)).append("\t");
      out.append(std::to_string(first->width)).append("\t").append(first->suffix).append("\n");
    }
    i += count;
  }
  return out;
}

std::vector<std::string> parseHostList(std::string_view value, size_t expected) {
  auto corrupt = [&](const std::string& why) {
    return ProtocolError("corrupt hosts list (" + why + "): '" +
                         text::printable(value.substr(0, 80)) + "'");
  };
  std::vector<std::string> names;
  names.reserve(expected);
  for (size_t start = 0; start < value.size();) {
    size_t end = value.find('\n', start);
    if (end == std::string_view::npos) throw corrupt("torn line");
    std::string_view line = value.substr(start, end - start);
    start = end + 1;
    if (line.starts_with("=") && isPlainField(line.substr(1), kMaxName)) {
      if (names.size() >= expected) throw corrupt("more than " + std::to_string(expected));
      names.emplace_back(line.substr(1));
      continue;
    }
    auto f = splitTabs(line.starts_with("~") ? line.substr(1) : std::string_view{});
    std::optional<int64_t> first, count;
    std::optional<int> width;
    if (f.size() != 5 || !(first = parseInt<int64_t>(f[1])) || *first < 0 ||
        !(count = parseInt<int64_t>(f[2])) || *count < 2 || !(width = parseInt<int>(f[3])) ||
        *width < 0 || *width > 18 || *first > kMaxRunStart ||
        !isPlainField(cat(f[0], cat(formatNumber(*first, *width), f[4])), kMaxName))
      throw corrupt("bad line");
    if (*count > static_cast<int64_t>(expected - names.size()))
      throw corrupt("more than " + std::to_string(expected));
    for (int64_t k = 0; k < *count; ++k) {
      std::string name(f[0]);
      name.append(formatNumber(*first + k, *width)).append(f[4]);
      names.push_back(std::move(name));
    }
  }
  if (names.size() != expected)
    throw corrupt(std::to_string(names.size()) + " names, expected " + std::to_string(expected));
  return names;
}


}  // namespace drun::rdzv::keys

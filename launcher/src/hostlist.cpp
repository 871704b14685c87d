// expandHostlist: parse the whole list first (so every error is found and the size is known before
// anything is expanded), then expand item by item, groups as an odometer (the last group fastest).
#include "drun/launcher/hostlist.hpp"

#include <algorithm>
#include <cstdint>
#include <variant>

#include "drun/common/error.hpp"

namespace drun::launch {
namespace {

struct Range {
  uint64_t lo = 0;
  uint64_t hi = 0;
  size_t width = 0;  // digits of lo as written: the zero padding of every value
  uint64_t size() const { return hi - lo + 1; }
};
using Group = std::vector<Range>;
using Part = std::variant<std::string, Group>;  // a literal run, or a bracket group
using Item = std::vector<Part>;

constexpr uint64_t kMaxBound = 4294967295ULL;  // SLURM's ranges are unsigned 32-bit

class Parser {
 public:
  Parser(std::string_view list, const HostlistOptions& options) : list_(list), options_(options) {}

  std::vector<Item> parse() {
    std::vector<Item> items;
    uint64_t total = 0;
    while (pos_ < list_.size()) {
      if (isSeparator(list_[pos_])) {
        ++pos_;
        continue;
      }
      size_t start = pos_;
      Item item = parseItem();
      if (size_t longest = longestName(item); longest > options_.maxNameLength)
        failAt(start, "a host name of " + std::to_string(longest) + " characters (at most " +
                          std::to_string(options_.maxNameLength) + ")");
      total += count(item);  // each count <= maxHosts + 1, so no overflow
      if (total > options_.maxHosts) fail("expands to more than " + std::to_string(options_.maxHosts) + " hosts");
      items.push_back(std::move(item));
    }
    if (items.empty()) fail("names no host");
    return items;
  }

 private:
  static bool isSeparator(char c) { return c == ',' || c == ' ' || c == '\t'; }

  [[noreturn]] void fail(const std::string& what) const {
    constexpr size_t kShown = 200;  // of the list, in the message
    std::string shown = list_.size() <= kShown ? std::string(list_) : std::string(list_.substr(0, kShown)) + "...";
    throw InvalidArgument("host list '" + shown + "': " + what);
  }
  [[noreturn]] void failAt(size_t at, const std::string& what) const {
    fail(what + " at character " + std::to_string(at + 1));
  }

  Item parseItem() {
    Item item;
    std::string literal;
    while (pos_ < list_.size() && !isSeparator(list_[pos_])) {
      char c = list_[pos_];
      if (c == '\\') {
        if (pos_ + 1 >= list_.size()) failAt(pos_, "'\\' escapes nothing");
        literal += list_[pos_ + 1];
        pos_ += 2;
      } else if (c == '[') {
        if (!literal.empty()) item.emplace_back(std::move(literal));
        literal.clear();
        item.emplace_back(parseGroup());
      } else if (c == ']') {
        failAt(pos_, "unbalanced ']'");
      } else {
        literal += c;
        ++pos_;
      }
    }
    if (!literal.empty()) item.emplace_back(std::move(literal));
    return item;
  }

  Group parseGroup() {
    size_t open = pos_++;
    Group group;
    size_t close = list_.find(']', pos_);
    if (close == std::string_view::npos) failAt(open, "unbalanced '['");
    std::string_view body = list_.substr(pos_, close - pos_);
    if (auto nested = body.find('['); nested != std::string_view::npos) failAt(pos_ + nested, "nested '['");
    if (body.empty()) failAt(open, "empty '[]'");
    size_t start = 0;
    while (start <= body.size()) {
      size_t comma = body.find(',', start);
      size_t end = comma == std::string_view::npos ? body.size() : comma;
      group.push_back(parseRange(body.substr(start, end - start), pos_ + start));
      start = end + 1;
    }
    pos_ = close + 1;
    return group;
  }

  Range parseRange(std::string_view text, size_t at) {
    if (text.empty()) failAt(at, "empty range");
    size_t dash = text.find('-');
    std::string_view loText = text.substr(0, dash);
    Range r;
    r.lo = parseBound(loText, at);
    r.width = loText.size();
    r.hi = dash == std::string_view::npos ? r.lo : parseBound(text.substr(dash + 1), at + dash + 1);
    if (r.hi < r.lo)
      failAt(at, "reversed range '" + std::string(text) + "' (" + std::to_string(r.lo) + " > " +
                     std::to_string(r.hi) + ")");
    return r;
  }

  uint64_t parseBound(std::string_view digits, size_t at) {
    if (digits.empty()) failAt(at, "missing number in range");
    if (digits.size() > 10) failAt(at, "number '" + std::string(digits) + "' too large");
    uint64_t value = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') failAt(at, "'" + std::string(digits) + "' is not a number");
      value = value * 10 + static_cast<uint64_t>(c - '0');
    }
    if (value > kMaxBound) failAt(at, "number '" + std::string(digits) + "' too large");
    return value;
  }

  // The longest name the item expands to: its literals plus each group's widest value.
  static size_t longestName(const Item& item) {
    size_t length = 0;
    for (const Part& part : item) {
      if (const auto* literal = std::get_if<std::string>(&part)) {
        length += literal->size();
        continue;
      }
      size_t widest = 0;
      for (const Range& r : std::get<Group>(part)) widest = std::max({widest, r.width, std::to_string(r.hi).size()});
      length += widest;
    }
    return length;
  }

  // Hosts the item expands to, saturated at maxHosts + 1.
  uint64_t count(const Item& item) const {
    const uint64_t cap = options_.maxHosts + 1;
    uint64_t n = 1;
    for (const Part& part : item) {
      const Group* group = std::get_if<Group>(&part);
      if (!group) continue;
      uint64_t values = 0;
      for (const Range& r : *group) values = std::min(cap, values + r.size());
      n = values != 0 && n > cap / values ? cap : std::min(cap, n * values);
    }
    return n;
  }

  std::string_view list_;
  const HostlistOptions& options_;
  size_t pos_ = 0;
};

std::string formatValue(uint64_t value, size_t width) {
  std::string digits = std::to_string(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// Every value of one group, in order.
std::vector<std::string> groupValues(const Group& group) {
  std::vector<std::string> values;
  for (const Range& r : group)
    for (uint64_t v = r.lo; v <= r.hi; ++v) values.push_back(formatValue(v, r.width));
  return values;
}

void expandItem(const Item& item, std::vector<std::string>& out) {
  std::vector<std::vector<std::string>> choices;  // one list per part (a literal: itself)
  for (const Part& part : item) {
    if (const auto* literal = std::get_if<std::string>(&part)) choices.push_back({*literal});
    else choices.push_back(groupValues(std::get<Group>(part)));
  }
  std::vector<size_t> index(choices.size(), 0);
  while (true) {
    std::string host;
    for (size_t i = 0; i < choices.size(); ++i) host += choices[i][index[i]];
    out.push_back(std::move(host));
    size_t i = choices.size();
    while (i > 0 && ++index[i - 1] == choices[i - 1].size()) index[--i] = 0;
    if (i == 0) return;
  }
}

}  // namespace

std::vector<std::string> expandHostlist(std::string_view list, const HostlistOptions& options) {
  std::vector<std::string> hosts;
  for (const Item& item : Parser(list, options).parse()) expandItem(item, hosts);
  return hosts;
}

}  // namespace drun::launch

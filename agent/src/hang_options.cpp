#include "drun/agent/hang_options.hpp"

#include "drun/common/env.hpp"
#include "drun/common/error.hpp"

namespace drun::agent {
namespace {

constexpr size_t kMaxSectionName = 63;

std::chrono::milliseconds positiveDuration(std::string_view text, const std::string& what) {
  auto d = env::parseDuration(text, what);
  if (d.count() <= 0) throw InvalidArgument(what + ": the timeout must be above 0, got '" + std::string(text) + "'");
  return d;
}

bool isSectionName(std::string_view name) {
  if (name.empty() || name.size() > kMaxSectionName) return false;
  for (unsigned char c : name)
    if (c < 0x20 || c >= 0x7f || c == ',' || c == '=') return false;
  return true;
}

std::string seconds(std::chrono::milliseconds d) {
  if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + "s";
  return std::to_string(d.count()) + "ms";
}

// ",floor=D,warmup=D" after "auto" (each at most once; the warm-up span may be 0).
void parseLearnSettings(std::string_view items, HangOptions& into) {
  const std::string what = "--hang-timeout auto";
  bool floor = false, span = false;
  while (!items.empty()) {
    items.remove_prefix(1);  // the ','
    const size_t comma = items.find(',');
    const std::string_view item = items.substr(0, comma);
    items = comma == std::string_view::npos ? std::string_view() : items.substr(comma);
    const size_t eq = item.find('=');
    const std::string_view name = item.substr(0, eq);
    if (eq == std::string_view::npos || (name != "floor" && name != "warmup"))
      throw InvalidArgument(what + ": expected floor=SECONDS or warmup=SECONDS after auto, got '" + std::string(item) + "'");
    bool& seen = name == "floor" ? floor : span;
    if (seen) throw InvalidArgument(what + ": " + std::string(name) + " given twice");
    seen = true;
    if (name == "floor") {
      into.learnFloor = positiveDuration(item.substr(eq + 1), what + " floor");
    } else {
      into.warmupSpan = env::parseDuration(item.substr(eq + 1), what + " warmup");
      if (into.warmupSpan.count() < 0) throw InvalidArgument(what + " warmup: the span must be 0 or more");
    }
  }
}

}  // namespace

void parseHangTimeout(std::string_view text, HangOptions& into) {
  const std::string what = "--hang-timeout";
  if (text.empty()) throw InvalidArgument(what + ": expected SECONDS, NAME=SECONDS,... or auto, got ''");
  if (text == "auto" || text.substr(0, 5) == "auto,") {
    into.learn = true;
    parseLearnSettings(text.substr(4), into);
    return;
  }
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string_view item = text.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    if (item.empty())
      throw InvalidArgument(what + ": an empty item in '" + std::string(text) + "'");
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      if (into.silence) throw InvalidArgument(what + ": two timeouts without a section name in '" + std::string(text) + "'");
      into.silence = positiveDuration(item, what);
    } else {
      std::string name(item.substr(0, eq));
      if (!isSectionName(name))
        throw InvalidArgument(what + ": '" + name + "' is not a section name (1 to 63 printable characters, no ',' or '=')");
      if (into.sections.count(name)) throw InvalidArgument(what + ": section '" + name + "' given twice");
      into.sections[name] = positiveDuration(item.substr(eq + 1), what + " " + name);
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
}

void parseHangIdle(std::string_view text, HangOptions& into) {
  into.idle = positiveDuration(text, "--hang-idle");
}

std::string describe(const HangOptions& o) {
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : "; ") + part; };
  if (o.silence) add("no heartbeat for " + seconds(*o.silence));
  for (const auto& [name, timeout] : o.sections) add(name + "=" + seconds(timeout));
  if (o.learn)
    add("learned (x" + std::to_string(static_cast<int>(o.factor)) + " after " + std::to_string(o.warmup) + " in " +
        seconds(o.warmupSpan) + ", at least " + seconds(o.learnFloor) + ")");
  if (o.idle) add("idle " + seconds(*o.idle));
  return out.empty() ? "off" : out;
}

}  // namespace drun::agent

#include "drun/common/host_port.hpp"

#include <algorithm>

#include "drun/common/error.hpp"
#include "drun/common/safe_text.hpp"

namespace drun {
namespace {

bool isNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '-' || c == '_';
}

bool isV6Char(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == ':' ||
         c == '.';
}

// An IPv6 address (with an optional %zone) as written inside brackets.
bool isV6Text(std::string_view text) {
  const size_t percent = text.find('%');
  const std::string_view address = text.substr(0, percent);
  if (address.find(':') == std::string_view::npos || !std::all_of(address.begin(), address.end(), isV6Char))
    return false;
  if (percent == std::string_view::npos) return true;
  const std::string_view zone = text.substr(percent + 1);
  return !zone.empty() && std::all_of(zone.begin(), zone.end(), isNameChar);
}

}  // namespace

HostPort HostPort::parse(std::string_view text, const HostPortRules& rules) {
  const std::string shown = "'" + drun::text::printable(text, {80}) + "'";
  auto fail = [&](const std::string& why) -> InvalidArgument {
    return InvalidArgument(rules.what + " " + shown + ": " + why);
  };
  if (text.empty()) throw InvalidArgument(rules.what + ": empty (want HOST[:PORT] or [IPV6]:PORT)");
  HostPort out;
  std::optional<std::string_view> port;  // the text after the separating ':'
  if (text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) throw fail("unbalanced '['");
    const std::string_view inside = text.substr(1, close - 1);
    if (!isV6Text(inside)) throw fail("'[" + std::string(inside) + "]' is not an IPv6 address");
    out.host = std::string(inside);
    const std::string_view after = text.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') throw fail("':' expected after ']'");
      port = after.substr(1);
    }
  } else {
    const size_t colon = text.find(':');
    if (colon != std::string_view::npos && text.find(':', colon + 1) != std::string_view::npos)
      throw fail("write an IPv6 address in brackets, as [ADDR] or [ADDR]:PORT");
    out.host = std::string(text.substr(0, colon));
    if (colon != std::string_view::npos) port = text.substr(colon + 1);
    if (out.host.empty()) throw fail("missing host");
    if (!std::all_of(out.host.begin(), out.host.end(), isNameChar))
      throw fail("the host may hold letters, digits, '.', '-' and '_' only");
  }
  if (!port) {
    if (!rules.defaultPort) throw fail("missing port (want HOST:PORT)");
    out.port = *rules.defaultPort;
    return out;
  }
  const std::string range = "(" + std::to_string(rules.minPort) + "-65535)";
  if (port->empty()) throw fail("missing port after ':'");
  if (port->size() > 5 || port->find_first_not_of("0123456789") != std::string_view::npos)
    throw fail("port '" + drun::text::printable(*port, {20}) + "' is not a number " + range);
  const long value = std::stol(std::string(*port));
  if (value < rules.minPort || value > 65535)
    throw fail("port " + std::to_string(value) + " is out of range " + range);
  out.port = static_cast<uint16_t>(value);
  return out;
}

std::string bracketedHost(std::string_view host) {
  return host.find(':') != std::string_view::npos ? "[" + std::string(host) + "]" : std::string(host);
}

std::string HostPort::toString() const { return bracketedHost(host) + ":" + std::to_string(port); }

}  // namespace drun

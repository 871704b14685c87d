// A network endpoint as a user writes it: HOST, HOST:PORT, [IPV6] or [IPV6]:PORT. Every endpoint
// drun reads (--rdzv-endpoint, the etcd members, drun-rendezvous --http, comm's tcp:// init
// method) is parsed here and printed by toString(), so that all of them follow one rule set:
//
//   - HOST is a name or an IPv4 address: letters, digits, '.', '-', '_'.
//   - An IPv6 address is written in brackets: [::1], [fe80::1%eth0]:29400. A bare IPv6 address
//     (two or more ':' outside brackets) is refused: in "fe80::1:2940" the last group could be
//     the address's or the port, and guessing would connect somewhere else.
//   - PORT is 1 to 5 decimal digits in [minPort, 65535]; a missing port takes the caller's
//     default, and is an error where the caller has none.
//
// Errors are InvalidArgument naming the input (`what`) and the bad text.
// Threading: a plain value type; the functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace drun {

struct HostPortRules {
  std::string what = "endpoint";       // names the input in errors, e.g. "--rdzv-endpoint"
  std::optional<uint16_t> defaultPort; // taken when the text has no port; nullopt: required
  uint16_t minPort = 1;                // 0 where the caller binds "any port"
};

struct HostPort {
  std::string host;  // a name, IPv4 or IPv6 address, without brackets; "" = none given
  uint16_t port = 0;

  // Throws InvalidArgument (see the rules above).
  static HostPort parse(std::string_view text, const HostPortRules& rules);
  // "host:port", or "[v6]:port" for an IPv6 host: what parse() reads back.
  std::string toString() const;
  bool isIpv6() const { return host.find(':') != std::string::npos; }
  // Spelled out, not defaulted: the torch extension (python/) includes this header as C++17.
  friend bool operator==(const HostPort& a, const HostPort& b) { return a.host == b.host && a.port == b.port; }
  friend bool operator!=(const HostPort& a, const HostPort& b) { return !(a == b); }
};

// An address as it stands before ":port" in a URL or an endpoint: IPv6 in brackets, else as is.
std::string bracketedHost(std::string_view host);

}  // namespace drun

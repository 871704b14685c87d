// HostPort: the one parser of HOST[:PORT] / [IPV6][:PORT] every endpoint goes through.
#include <catch2/catch.hpp>

#include "drun/common/error.hpp"
#include "drun/common/host_port.hpp"

using drun::HostPort;
using drun::HostPortRules;
using drun::InvalidArgument;

namespace {

HostPortRules withDefault(uint16_t port) {
  HostPortRules rules;
  rules.what = "--rdzv-endpoint";
  rules.defaultPort = port;
  return rules;
}

HostPortRules portRequired() {
  HostPortRules rules;
  rules.what = "init";
  return rules;
}

}  // namespace

TEST_CASE("HostPort: IPv4 addresses and names, with and without a port", "[host_port]") {
  CHECK(HostPort::parse("10.0.0.7:29400", portRequired()) == HostPort{"10.0.0.7", 29400});
  CHECK(HostPort::parse("10.0.0.7", withDefault(29400)) == HostPort{"10.0.0.7", 29400});
  CHECK(HostPort::parse("node-7.cluster_a.example.org:1", portRequired()) ==
        HostPort{"node-7.cluster_a.example.org", 1});
  CHECK(HostPort::parse("localhost:65535", portRequired()) == HostPort{"localhost", 65535});
  CHECK(HostPort::parse("h1", withDefault(2379)) == HostPort{"h1", 2379});
}

TEST_CASE("HostPort: IPv6 in brackets, with a zone, with and without a port", "[host_port]") {
  CHECK(HostPort::parse("[::1]:29400", portRequired()) == HostPort{"::1", 29400});
  CHECK(HostPort::parse("[::1]", withDefault(29400)) == HostPort{"::1", 29400});
  CHECK(HostPort::parse("[fe80::1%eth0]:80", portRequired()) == HostPort{"fe80::1%eth0", 80});
  CHECK(HostPort::parse("[::ffff:10.0.0.1]:5", portRequired()) == HostPort{"::ffff:10.0.0.1", 5});
  CHECK(HostPort::parse("[2001:DB8::A]:7", portRequired()).isIpv6());
}

TEST_CASE("HostPort: a bare IPv6 address is refused, asking for brackets", "[host_port]") {
  // "fe80::1:2940" reads as an address or as fe80::1 port 2940: no guess is made.
  for (const char* bare : {"::1", "fe80::1:2940", "::1:29400", "2001:db8::1"})
    CHECK_THROWS_WITH(HostPort::parse(bare, withDefault(29400)),
                      Catch::Contains(std::string("'") + bare + "'") && Catch::Contains("in brackets"));
}

TEST_CASE("HostPort: missing, empty, junk and out-of-range ports", "[host_port]") {
  CHECK_THROWS_WITH(HostPort::parse("h1", portRequired()),
                    Catch::Equals("init 'h1': missing port (want HOST:PORT)"));
  CHECK_THROWS_WITH(HostPort::parse("[::1]", portRequired()), Catch::Contains("missing port"));
  CHECK_THROWS_WITH(HostPort::parse("h1:", withDefault(1)),
                    Catch::Equals("--rdzv-endpoint 'h1:': missing port after ':'"));
  CHECK_THROWS_WITH(HostPort::parse("[::1]:", withDefault(1)), Catch::Contains("missing port after ':'"));
  CHECK_THROWS_WITH(HostPort::parse("h1:65536", withDefault(1)),
                    Catch::Equals("--rdzv-endpoint 'h1:65536': port 65536 is out of range (1-65535)"));
  CHECK_THROWS_WITH(HostPort::parse("h1:99999999999", withDefault(1)), Catch::Contains("is not a number"));
  CHECK_THROWS_WITH(HostPort::parse("h1:-5", withDefault(1)), Catch::Contains("port '-5' is not a number"));
  CHECK_THROWS_WITH(HostPort::parse("h1:29x", withDefault(1)), Catch::Contains("port '29x'"));
  CHECK_THROWS_WITH(HostPort::parse("h1:0", withDefault(1)), Catch::Contains("port 0 is out of range"));
  HostPortRules any = withDefault(0);
  any.minPort = 0;
  CHECK(HostPort::parse("h1:0", any) == HostPort{"h1", 0});
}

TEST_CASE("HostPort: missing hosts and junk are clear errors naming the text", "[host_port]") {
  CHECK_THROWS_WITH(HostPort::parse("", withDefault(1)), Catch::Contains("--rdzv-endpoint: empty"));
  CHECK_THROWS_WITH(HostPort::parse(":29400", withDefault(1)),
                    Catch::Equals("--rdzv-endpoint ':29400': missing host"));
  CHECK_THROWS_WITH(HostPort::parse("[::1", withDefault(1)), Catch::Contains("unbalanced '['"));
  CHECK_THROWS_WITH(HostPort::parse("[::1]29400", withDefault(1)), Catch::Contains("':' expected after ']'"));
  CHECK_THROWS_WITH(HostPort::parse("[]:1", withDefault(1)), Catch::Contains("is not an IPv6 address"));
  CHECK_THROWS_WITH(HostPort::parse("[node1]:1", withDefault(1)), Catch::Contains("is not an IPv6 address"));
  CHECK_THROWS_WITH(HostPort::parse("[::1%]:1", withDefault(1)), Catch::Contains("is not an IPv6 address"));
  for (const char* junk : {"evil.com/x:1", "a b:1", "h@x", "$(id):1", "h,1:2"})
    CHECK_THROWS_WITH(HostPort::parse(junk, withDefault(1)), Catch::Contains("letters, digits"));
  // Control characters are shown escaped, never printed raw.
  CHECK_THROWS_WITH(HostPort::parse("a\x1b[2J:1", withDefault(1)), Catch::Contains("'a?[2J:1'"));
  CHECK_THROWS_AS(HostPort::parse("http://h1:2379", withDefault(1)), InvalidArgument);
}

TEST_CASE("HostPort: toString brackets IPv6 and reads back", "[host_port]") {
  CHECK(HostPort{"10.0.0.1", 29400}.toString() == "10.0.0.1:29400");
  CHECK(HostPort{"::1", 29400}.toString() == "[::1]:29400");
  CHECK(drun::bracketedHost("fe80::1%eth0") == "[fe80::1%eth0]");
  CHECK(drun::bracketedHost("h1") == "h1");
  for (const HostPort& e : {HostPort{"h1", 1}, HostPort{"::1", 65535}, HostPort{"fe80::2%lo", 80}})
    CHECK(HostPort::parse(e.toString(), portRequired()) == e);
}

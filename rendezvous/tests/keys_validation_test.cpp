// Everything read back from the store is validated before use: another client of the store may
// have written it. MASTER_ADDR is a host name or an address; texts that get printed
// are bounded and printable; numbers are in range.
#include <catch2/catch.hpp>

#include "drun/common/error.hpp"
#include "drun/rendezvous/keys.hpp"

using namespace drun::rdzv;
using drun::ProtocolError;

namespace {

// A closed round's header as the closer writes it, with `addr` as MASTER_ADDR.
std::string stateWith(const std::string& addr, int nodes = 1, int world = 4,
                      const std::string& counters = "0\t0\t0") {
  return "ok\t" + std::to_string(nodes) + "\t" + std::to_string(world) + "\t" + addr +
         "\t29500\t" + counters + "\t0000000000000000\n";
}

}  // namespace

TEST_CASE("keys: host names and addresses are told from anything else", "[rendezvous][keys]") {
  for (const char* good : {"10.0.0.7", "::1", "fe80::1", "node7", "gpu-007.cluster.example.org",
                           "n_1.local.", "localhost", "a"})
    CHECK(keys::isHostOrAddress(good));
  for (const char* bad : {"", "-rf", "host-", "a..b", ".", "host name", "host;rm", "h\x1b[2J",
                          "10.0.0.7:29500", "[::1]", "evil.com/x", "a\nb", "$(id)"})
    CHECK_FALSE(keys::isHostOrAddress(bad));
  CHECK_FALSE(keys::isHostOrAddress(std::string(64, 'a')));  // a label over 63
  CHECK(keys::isHostOrAddress(std::string(63, 'a') + "." + std::string(63, 'b')));
  CHECK_FALSE(keys::isHostOrAddress(std::string(300, 'a')));
}

TEST_CASE("keys: a round state whose MASTER_ADDR is not a host or an address is refused",
          "[rendezvous][keys]") {
  auto ok = keys::parseState(stateWith("10.0.0.7"));
  REQUIRE(ok);
  CHECK(ok->masterAddr == "10.0.0.7");
  CHECK(keys::parseState(stateWith("node0.cluster"))->masterAddr == "node0.cluster");
  // A forged round pointing workers elsewhere with an injected option, or at a terminal.
  CHECK_THROWS_AS(keys::parseState(stateWith("evil.host --opt")), ProtocolError);
  CHECK_THROWS_AS(keys::parseState(stateWith("\xC2\x9B" "31m")), ProtocolError);
  CHECK_THROWS_AS(keys::parseState(stateWith("a:b:c:zz")), ProtocolError);
  // Numbers out of range: a world larger than its nodes can hold, negative counters.
  CHECK_THROWS_AS(keys::parseState(stateWith("10.0.0.7", 1, (1 << 20) + 1)), ProtocolError);
  CHECK_THROWS_AS(keys::parseState(stateWith("10.0.0.7", 1, 4, "-1\t0\t0")), ProtocolError);
  CHECK_THROWS_AS(keys::parseState(stateWith("10.0.0.7", 1, 4, "0\t-5\t0")), ProtocolError);
  CHECK_THROWS_AS(keys::parseAssignment("2000000\t0"), ProtocolError);
  // A descriptor whose address is not one is skipped like any malformed line.
  size_t skipped = 0;
  auto nodes = keys::parseJoined("n1\thost\tevil;addr\t1\t-\t0\t-\n", &skipped);
  CHECK(nodes.empty());
  CHECK(skipped == 1);
  keys::NodeDescriptor d;
  d.id = "n1";
  d.host = "host";
  d.addr = "not an address";
  CHECK_THROWS_AS(keys::encodeDescriptor(d), drun::InvalidArgument);
}

TEST_CASE("keys: a round's roster digest names its members, survives the header-only form and is checked",
          "[rendezvous][keys]") {
  keys::RoundState s;
  s.nodeCount = 2;
  s.worldSize = 3;
  s.masterAddr = "10.0.0.7";
  s.masterPort = 29500;
  s.roster = {{"aaaa", "h0", 1}, {"bbbb", "h1", 2}};
  const auto full = keys::parseState(keys::encodeState(s));
  REQUIRE(full);
  CHECK(full->rosterDigest == keys::rosterDigest(s.roster));
  const auto header = keys::parseState(keys::encodeState(s, /*withRoster=*/false));
  REQUIRE(header);
  CHECK(header->roster.empty());
  CHECK(header->rosterDigest == full->rosterDigest);
  CHECK(keys::encodeState(*header, false) == keys::encodeState(s, false));
  // Another member, the same members at other node ranks, another local world size: other digests.
  CHECK(keys::rosterDigest({{"aaaa", "h0", 1}, {"cccc", "h1", 2}}) != full->rosterDigest);
  CHECK(keys::rosterDigest({{"bbbb", "h1", 2}, {"aaaa", "h0", 1}}) != full->rosterDigest);
  CHECK(keys::rosterDigest({{"aaaa", "h0", 1}, {"bbbb", "h1", 3}}) != full->rosterDigest);
  CHECK(keys::rosterDigest({{"aaaa", "other name", 1}, {"bbbb", "h1", 2}}) == full->rosterDigest);
  // A roster that does not match its digest, a digest that is not 16 hex digits: corrupt.
  std::string forged = keys::encodeState(s);
  forged.replace(forged.find("aaaa"), 4, "zzzz");
  CHECK_THROWS_AS(keys::parseState(forged), ProtocolError);
  CHECK_THROWS_AS(keys::parseState("ok\t1\t4\t10.0.0.7\t29500\t0\t0\t0\t0123456789abcdeg\n"), ProtocolError);
  CHECK_THROWS_AS(keys::parseState("ok\t1\t4\t10.0.0.7\t29500\t0\t0\t0\tABCDEF0123456789\n"), ProtocolError);
  CHECK_THROWS_AS(keys::parseState("ok\t1\t4\t10.0.0.7\t29500\t0\t0\t0\n"), ProtocolError);
}

TEST_CASE("keys: a round's error text is bounded and stripped of control characters",
          "[rendezvous][keys]") {
  std::string error = "error\t\x1b]0;pwned\x07\x1b[2Jjoin failed\r" + std::string(16u << 20, 'x');
  auto s = keys::parseState(error);
  REQUIRE(s);
  CHECK_FALSE(s->ok);
  CHECK(s->error.size() < 4200);
  CHECK(s->error.find('\x1b') == std::string::npos);
  CHECK(s->error.find('\x07') == std::string::npos);
  CHECK(s->error.find('\r') == std::string::npos);
  CHECK(s->error.rfind("?]0;pwned??[2Jjoin failed", 0) == 0);
  CHECK_THAT(s->error, Catch::EndsWith("more bytes)"));
}

TEST_CASE("keys: a failure record's detail is printable and its numbers in range",
          "[rendezvous][keys]") {
  FailureRecord f;
  f.rank = 3;
  f.node = "node7";
  f.exitCode = 1;
  f.pid = 4242;
  f.detailSource = "stderr";
  f.detail = "Traceback:\n  line 1\x1b[31m red\x1b[0m\r\nValueError";
  auto back = keys::parseFailure(keys::encodeFailure(f));
  CHECK(back.detail == "Traceback:\n  line 1?[31m red?[0m\nValueError");  // lines kept
  // Written by hand into the store: out-of-range numbers are corrupt.
  const std::string tail = "\tn\t-\n";
  CHECK_THROWS_AS(keys::parseFailure("0\t0\t300\t0\t1\t0\t0\t0" + tail), ProtocolError);
  CHECK_THROWS_AS(keys::parseFailure("0\t0\t1\t0\t-7\t0\t0\t0" + tail), ProtocolError);
  CHECK_NOTHROW(keys::parseFailure("0\t0\t1\t0\t7\t0\t0\t0" + tail));
}

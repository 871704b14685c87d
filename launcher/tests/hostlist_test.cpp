#include <catch2/catch.hpp>

#include "drun/common/error.hpp"
#include "drun/launcher/hostlist.hpp"

using drun::launch::expandHostlist;
using drun::launch::HostlistOptions;
using Hosts = std::vector<std::string>;

namespace {
std::string hostlistError(const std::string& list, HostlistOptions options = {}) {
  try {
    expandHostlist(list, options);
  } catch (const drun::InvalidArgument& e) {
    return e.what();
  }
  FAIL("expected an error for '" << list << "'");
  return {};
}
}  // namespace

TEST_CASE("hostlist: plain names and comma lists", "[launcher]") {
  CHECK(expandHostlist("n1") == Hosts{"n1"});
  CHECK(expandHostlist("vm") == Hosts{"vm"});
  CHECK(expandHostlist("a,b,c") == Hosts{"a", "b", "c"});
  CHECK(expandHostlist("host-1.example.org,host-2") == Hosts{"host-1.example.org", "host-2"});
  CHECK(expandHostlist("a,,b,") == Hosts{"a", "b"});  // SLURM skips empty items
  CHECK(expandHostlist("a b\tc") == Hosts{"a", "b", "c"});
}

TEST_CASE("hostlist: ranges and single values in brackets", "[launcher]") {
  CHECK(expandHostlist("n[1-4]") == Hosts{"n1", "n2", "n3", "n4"});
  CHECK(expandHostlist("n[1-4,7]") == Hosts{"n1", "n2", "n3", "n4", "n7"});
  CHECK(expandHostlist("n[3]") == Hosts{"n3"});
  CHECK(expandHostlist("n[9-11]") == Hosts{"n9", "n10", "n11"});
  CHECK(expandHostlist("n[5,2]") == Hosts{"n5", "n2"});  // order as written
  CHECK(expandHostlist("[1-2]") == Hosts{"1", "2"});
}

TEST_CASE("hostlist: zero padding follows the lower bound's digits", "[launcher]") {
  auto gpus = expandHostlist("gpu[001-016]");
  REQUIRE(gpus.size() == 16);
  CHECK(gpus.front() == "gpu001");
  CHECK(gpus[9] == "gpu010");
  CHECK(gpus.back() == "gpu016");
  CHECK(expandHostlist("n[08-11]") == Hosts{"n08", "n09", "n10", "n11"});
  CHECK(expandHostlist("n[98-101]") == Hosts{"n98", "n99", "n100", "n101"});
  CHECK(expandHostlist("n[0-1,007]") == Hosts{"n0", "n1", "n007"});
}

TEST_CASE("hostlist: suffixes, several items and several bracket groups", "[launcher]") {
  CHECK(expandHostlist("a1,b[2-3]c") == Hosts{"a1", "b2c", "b3c"});
  CHECK(expandHostlist("n[1-2].ib,x") == Hosts{"n1.ib", "n2.ib", "x"});
  CHECK(expandHostlist("r[1-2]n[1-3]") == Hosts{"r1n1", "r1n2", "r1n3", "r2n1", "r2n2", "r2n3"});
  CHECK(expandHostlist("rack[01-02]-node[7,9]-ib") ==
        Hosts{"rack01-node7-ib", "rack01-node9-ib", "rack02-node7-ib", "rack02-node9-ib"});
  CHECK(expandHostlist("a[1-2],b[3,5],c") == Hosts{"a1", "a2", "b3", "b5", "c"});
}

TEST_CASE("hostlist: a backslash makes the next character literal", "[launcher]") {
  CHECK(expandHostlist("a\\[1\\]") == Hosts{"a[1]"});
  CHECK(expandHostlist("a\\,b,c") == Hosts{"a,b", "c"});
  CHECK(expandHostlist("x\\\\y") == Hosts{"x\\y"});
  CHECK(expandHostlist("n\\-[1-2]") == Hosts{"n-1", "n-2"});
}

TEST_CASE("hostlist: malformed lists are errors naming the problem", "[launcher]") {
  CHECK_THAT(hostlistError("n[1-4"), Catch::Contains("unbalanced '['") && Catch::Contains("n[1-4"));
  CHECK_THAT(hostlistError("n1-4]"), Catch::Contains("unbalanced ']'"));
  CHECK_THAT(hostlistError("n[1-[2]]"), Catch::Contains("nested"));
  CHECK_THAT(hostlistError("n[4-1]"), Catch::Contains("reversed range"));
  CHECK_THAT(hostlistError("n[]"), Catch::Contains("empty"));
  CHECK_THAT(hostlistError("n[1,,2]"), Catch::Contains("empty range"));
  CHECK_THAT(hostlistError("n[a-b]"), Catch::Contains("not a number"));
  CHECK_THAT(hostlistError("n[1-]"), Catch::Contains("missing number"));
  CHECK_THAT(hostlistError("n[-1]"), Catch::Contains("missing number"));
  CHECK_THAT(hostlistError("n[1--2]"), Catch::Contains("not a number"));
  CHECK_THAT(hostlistError("n[99999999999]"), Catch::Contains("too large"));
  CHECK_THAT(hostlistError("n[4294967296]"), Catch::Contains("too large"));
  CHECK_THAT(hostlistError("n\\"), Catch::Contains("escapes nothing"));
  CHECK_THAT(hostlistError(""), Catch::Contains("names no host"));
  CHECK_THAT(hostlistError(" , "), Catch::Contains("names no host"));
  CHECK_THAT(hostlistError("n[1-4"), Catch::Contains("character 2"));
}

TEST_CASE("hostlist: the expansion size is bounded before anything is expanded", "[launcher]") {
  CHECK_THAT(hostlistError("n[0-4294967295]"), Catch::Contains("more than 65536 hosts"));
  CHECK_THAT(hostlistError("a[0-4294967295]b[0-4294967295]c[0-4294967295]"), Catch::Contains("more than"));
  CHECK_THAT(hostlistError("n[1-300]m[1-300]"), Catch::Contains("more than 65536"));
  HostlistOptions small;
  small.maxHosts = 4;
  CHECK(expandHostlist("n[1-4]", small).size() == 4);
  CHECK_THAT(hostlistError("n[1-4],x", small), Catch::Contains("more than 4 hosts"));
  CHECK_THAT(hostlistError("n[1-2]m[1-3]", small), Catch::Contains("more than 4 hosts"));
  CHECK(expandHostlist("n[1-65536]").size() == 65536);
}

TEST_CASE("hostlist: host names and error messages have bounded length", "[launcher]") {
  std::string longName(300, 'a');
  CHECK_THAT(hostlistError(longName), Catch::Contains("300 characters"));
  CHECK_THAT(hostlistError(std::string(200, 'b') + "[1-100000]"), Catch::Contains("more than 65536"));
  CHECK_THAT(hostlistError(std::string(254, 'c') + "[1-10]"), Catch::Contains("256 characters"));
  CHECK(expandHostlist(std::string(253, 'd') + "[01-10]").size() == 10);
  std::string huge(1 << 20, 'x');
  huge += "[";
  std::string e = hostlistError(huge);
  CHECK(e.size() < 400);  // the list is cut in the message
}

// StoreCore's byte budget (in all and per job scope) and its watchers' digests of `known`.
#include <catch2/catch.hpp>

#include <string>

#include "drun/common/error.hpp"
#include "drun/store/store_core.hpp"

using namespace drun::rdzv;

namespace {

StoreBudget smallBudget() {
  StoreBudget b;
  b.maxStoredBytes = 10'000;
  b.maxStoredBytesPerJob = 4'000;
  return b;
}

std::string refusal(const std::function<void()>& write) {
  try {
    write();
  } catch (const drun::InvalidArgument& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("store budget: a job scope over its share is refused naming the limit and other scopes go on",
          "[store][limits]") {
  StoreCore core(kStoreLimits, smallBudget());
  core.set("rdzv/a/x", std::string(3'000, 'v'));
  CHECK(core.storedBytes() == 3'000 + 8 + kStoredEntryOverhead);
  CHECK(core.storedBytesOfScope("rdzv/a/other") == core.storedBytes());
  CHECK_THAT(refusal([&] { core.set("rdzv/a/y", std::string(1'000, 'v')); }),
             Catch::Contains("maxStoredBytesPerJob") && Catch::Contains("rdzv/a/"));
  CHECK_THAT(refusal([&] { core.append("rdzv/a/x", std::string(1'000, 'v')); }),
             Catch::Contains("maxStoredBytesPerJob"));
  CHECK_THAT(refusal([&] { core.multiSet({"rdzv/a/p", "rdzv/a/q"}, {"1", std::string(900, 'v')}); }),
             Catch::Contains("maxStoredBytesPerJob"));
  CHECK_FALSE(core.check({"rdzv/a/p"}));  // a refused multiSet writes nothing
  // Overwriting with a smaller value is always allowed; so are other jobs.
  core.set("rdzv/a/x", "small");
  core.set("rdzv/a/y", std::string(1'000, 'v'));
  core.set("rdzv/b/x", std::string(3'000, 'v'));
  core.set("loose", std::string(3'000, 'v'));  // outside any job: the scope ""
  CHECK_THAT(refusal([&] { core.set("rdzv/c/x", std::string(3'000, 'v')); }),
             Catch::Contains("maxStoredBytes "));
  // Deleting gives the bytes back, to the scope and to the total.
  CHECK(core.erasePrefix("rdzv/b/") == 1);
  core.set("rdzv/c/x", std::string(3'000, 'v'));
  core.erase("rdzv/c/x");
  core.erase("rdzv/a/x");
  core.erase("rdzv/a/y");
  core.erase("loose");
  CHECK(core.storedBytes() == 0);
}

TEST_CASE("store budget: a will over the budget is skipped entry by entry", "[store][limits]") {
  StoreCore core(kStoreLimits, smallBudget());
  auto client = core.newClient();
  core.setWill(client, {{{"rdzv/a/big", std::string(5'000, 'v')}, {"rdzv/a/dead", "1"}}, {}, {}});
  CHECK(core.clientGone(client));
  CHECK_FALSE(core.check({"rdzv/a/big"}));
  CHECK(core.tryGet("rdzv/a/dead") == "1");
}

TEST_CASE("store watch: the known value is kept as a digest and compared by it", "[store]") {
  StoreCore core;
  const std::string big(1u << 20, 'k');
  core.set("w", big);
  auto client = core.newClient();
  std::optional<Bytes> seen;
  int calls = 0;
  auto id = core.watch(client, "w", std::optional<Bytes>(big), [&](const std::optional<Bytes>& v) {
    seen = v;
    ++calls;
  });
  REQUIRE(id != 0);
  core.set("w", big);  // the same bytes again: no change
  CHECK(calls == 0);
  std::string sameSize = big;
  sameSize.back() = 'x';
  core.set("w", sameSize);  // same size, other bytes: a change
  CHECK(calls == 1);
  CHECK(seen == sameSize);
  // Known absent: fires on creation; known present: fires on deletion.
  CHECK(core.watch(client, "new", std::optional<Bytes>(), [&](const std::optional<Bytes>&) { ++calls; }) != 0);
  core.set("new", "");
  CHECK(calls == 2);
  CHECK(core.watch(client, "new", std::optional<Bytes>(""), [&](const std::optional<Bytes>& v) {
    seen = v;
    ++calls;
  }) != 0);
  core.erase("new");
  CHECK(calls == 3);
  CHECK_FALSE(seen.has_value());
  CHECK(core.differs("w", KnownValue::of(big)));
  CHECK_FALSE(core.differs("w", KnownValue::of(sameSize)));
}

#include <catch2/catch.hpp>

#include "drun/common/env.hpp"
#include "drun/common/error.hpp"

using namespace std::chrono_literals;
namespace env = drun::env;

TEST_CASE("durations parse with torchrun's bare-seconds convention", "[common]") {
  CHECK(env::parseDuration("30", "x") == 30000ms);
  CHECK(env::parseDuration("1.5", "x") == 1500ms);
  CHECK(env::parseDuration("250ms", "x") == 250ms);
  CHECK(env::parseDuration("2m", "x") == 120000ms);
  CHECK_THROWS_AS(env::parseDuration("", "x"), drun::InvalidArgument);
  CHECK_THROWS_AS(env::parseDuration("-1", "x"), drun::InvalidArgument);
  CHECK_THROWS_AS(env::parseDuration("10 parsecs", "x"), drun::InvalidArgument);
  CHECK_THROWS_WITH(env::parseDuration("abc", "join_timeout"), Catch::Contains("join_timeout"));
}

TEST_CASE("integers are range-checked and fully consumed", "[common]") {
  CHECK(env::parseInt("42", "n", 0, 100) == 42);
  CHECK_THROWS_AS(env::parseInt("101", "n", 0, 100), drun::InvalidArgument);
  CHECK_THROWS_AS(env::parseInt("4x", "n", 0, 100), drun::InvalidArgument);
  CHECK_THROWS_AS(env::parseInt("", "n", 0, 100), drun::InvalidArgument);
  CHECK_THROWS_AS(env::parseInt("99999999999999999999", "n", 0, 100), drun::InvalidArgument);
}

TEST_CASE("every registered DRUN_ variable has a doc and a parsable default", "[common]") {
  for (const auto& v : env::drunVariables()) {
    CHECK(v.name.starts_with("DRUN_"));
    CHECK_FALSE(v.doc.empty());
    if (v.type == env::VarType::DurationMs && !v.defaultValue.empty())
      CHECK_NOTHROW(env::parseDuration(v.defaultValue, v.name));
  }
}

// Replays the hostlist fuzzer's corpus (launcher/fuzz/corpus/hostlist) through the same checks
// in the ordinary build, so each saved input stays a regression test.
#include <catch2/catch.hpp>

#include "../fuzz/hostlist_check.hpp"

TEST_CASE("hostlist corpus: every saved list expands within bounds or is rejected",
          "[hostlist][fuzz]") {
  const auto dir = std::filesystem::path(DRUN_SOURCE_DIR) / "launcher/fuzz/corpus/hostlist";
  REQUIRE(std::filesystem::is_directory(dir));
  CHECK(drun::fuzz::replayCorpus(dir, drun::launch::fuzz::checkHostlistInput) >= 10);
}

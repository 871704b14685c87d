// Replays the command-line fuzzer's corpus (launcher/fuzz/corpus/cli: NUL-separated arguments)
// through the same checks in the ordinary build, so each saved input stays a regression test.
#include <catch2/catch.hpp>

#include "../fuzz/cli_check.hpp"

TEST_CASE("cli corpus: every saved command line parses or is a usage error", "[cli][fuzz]") {
  const auto dir = std::filesystem::path(DRUN_SOURCE_DIR) / "launcher/fuzz/corpus/cli";
  REQUIRE(std::filesystem::is_directory(dir));
  CHECK(drun::fuzz::replayCorpus(dir, drun::launch::fuzz::checkCliInput) >= 10);
}

TEST_CASE("cli corpus: the fuzz argv ends with a program the parser resolves", "[cli][fuzz]") {
  auto args = drun::launch::fuzz::fuzzArgv(std::string_view("--nproc-per-node\0" "3", 18));
  REQUIRE(args == std::vector<std::string>{"drun", "--nproc-per-node", "3", "--", "/bin/true"});
  auto result = drun::launch::parseCommandLine(args);
  CHECK(result.config.program.at(0) == "/bin/true");
  CHECK(result.config.nprocPerNode == 3);
}

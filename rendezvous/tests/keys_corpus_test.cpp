// Replays the key-scheme fuzzer's corpus (rendezvous/fuzz/corpus/keys: seeds and every crash it
// found) through the same checks in the ordinary build, so each stays a regression test.
#include <catch2/catch.hpp>

#include "../fuzz/keys_check.hpp"

TEST_CASE("keys corpus: every saved value parses or is rejected with encoders and parsers agreeing",
          "[keys][fuzz]") {
  const auto dir = std::filesystem::path(DRUN_SOURCE_DIR) / "rendezvous/fuzz/corpus/keys";
  REQUIRE(std::filesystem::is_directory(dir));
  CHECK(drun::fuzz::replayCorpus(dir, drun::rdzv::fuzz::checkKeysInput) >= 10);
}

TEST_CASE("keys corpus: a host list folding a number beyond 2^53 parses back (fuzz-found)",
          "[keys][fuzz]") {
  namespace keys = drun::rdzv::keys;
  const std::vector<std::string> names{"n90071992547409930", "n90071992547409931", "n7", "n8"};
  const std::string encoded = keys::encodeHostList(names);
  CHECK(keys::parseHostList(encoded, names.size()) == names);
  CHECK(encoded.find("~n\t7\t2") != std::string::npos);  // small numbers are still folded
}

// Replays the wire fuzzer's corpus (rendezvous/store/fuzz/corpus/wire: seeds and every crash it found)
// through the same checks in the ordinary build, so each stays a regression test.
#include <catch2/catch.hpp>

#include "../fuzz/wire_check.hpp"

TEST_CASE("wire corpus: every saved input decodes without breaking the codec's invariants",
          "[protocol][fuzz]") {
  const auto dir = std::filesystem::path(DRUN_SOURCE_DIR) / "rendezvous/store/fuzz/corpus/wire";
  REQUIRE(std::filesystem::is_directory(dir));
  // checkWireInput aborts on a broken invariant.
  CHECK(drun::fuzz::replayCorpus(dir, drun::rdzv::fuzz::checkWireInput) >= 8);
}

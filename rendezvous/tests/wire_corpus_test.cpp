// Replays the wire fuzzer's corpus (rendezvous/fuzz/corpus/wire: seeds and every crash it found)
// through the same checks in the ordinary build, so each stays a regression test.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../fuzz/wire_check.hpp"

namespace fs = std::filesystem;

TEST_CASE("wire corpus: every saved input decodes without breaking the codec's invariants",
          "[protocol][fuzz]") {
  const fs::path dir = fs::path(DRUN_SOURCE_DIR) / "rendezvous" / "fuzz" / "corpus" / "wire";
  REQUIRE(fs::is_directory(dir));
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    INFO(entry.path());
    drun::rdzv::fuzz::checkWireInput(bytes.str());  // aborts on a broken invariant
    ++files;
  }
  CHECK(files >= 8);
}

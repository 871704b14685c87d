// Replays the store server fuzzer's corpus (rendezvous/fuzz/corpus/server: byte streams a peer
// could send) through the same checks in the ordinary build, so each stays a regression test.
#include <catch2/catch.hpp>

#include "../fuzz/server_check.hpp"

TEST_CASE("server corpus: the store server survives every saved byte stream and keeps serving",
          "[server][fuzz]") {
  const auto dir = std::filesystem::path(DRUN_SOURCE_DIR) / "rendezvous/fuzz/corpus/server";
  REQUIRE(std::filesystem::is_directory(dir));
  CHECK(drun::fuzz::replayCorpus(dir, drun::rdzv::fuzz::checkServerInput) >= 8);
  auto& server = drun::rdzv::fuzz::fuzzServer();
  const auto stats = server.stats();
  CHECK(stats.connectionsAccepted >= 8);
  CHECK(stats.protocolErrors >= 1);  // bad_magic and huge_frame_claim are refused
  CHECK(stats.requestsServed >= 1);  // the well-formed streams are served
}

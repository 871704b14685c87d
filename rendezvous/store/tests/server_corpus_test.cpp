// Replays the store server fuzzer's corpus (rendezvous/store/fuzz/corpus/server: byte streams a peer
// could send) through the same checks in the ordinary build, so each stays a regression test.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "../fuzz/server_check.hpp"

TEST_CASE("server corpus: the store server survives every saved byte stream and keeps serving",
          "[server][fuzz]") {
  const auto dir = std::filesystem::path(DRUN_SOURCE_DIR) / "rendezvous/store/fuzz/corpus/server";
  REQUIRE(std::filesystem::is_directory(dir));
  CHECK(drun::fuzz::replayCorpus(dir, drun::rdzv::fuzz::checkServerInput) >= 8);
  auto& server = drun::rdzv::fuzz::fuzzServer();
  const auto stats = server.stats();
  CHECK(stats.connectionsAccepted >= 8);
  CHECK(stats.protocolErrors >= 1);  // bad_magic and huge_frame_claim are refused
  CHECK(stats.requestsServed >= 1);  // the well-formed streams are served
}

// A little of what fuzz_server does (server_check.hpp), in every build, with gcc too: the saved
// streams mutated at random (seeded, so a failure repeats), within a bounded count and time.
TEST_CASE("server corpus: mutated byte streams neither crash nor wedge the store server",
          "[server][fuzz]") {
  const auto dir = std::filesystem::path(DRUN_SOURCE_DIR) / "rendezvous/store/fuzz/corpus/server";
  std::vector<std::string> seeds;
  drun::fuzz::replayCorpus(dir, [&](const std::string& bytes) { seeds.push_back(bytes); });
  REQUIRE(seeds.size() >= 8);
  std::mt19937 random(20261123);
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : size_t(random() % n); };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  int inputs = 0;
  for (; inputs < 400 && std::chrono::steady_clock::now() < deadline; ++inputs) {
    std::string s = seeds[pick(seeds.size())];
    for (int edits = 1 + int(pick(4)); edits > 0; --edits) {
      switch (pick(4)) {
        case 0:  // flip a byte
          if (!s.empty()) s[pick(s.size())] ^= char(1 + pick(255));
          break;
        case 1:  // insert random bytes
          s.insert(pick(s.size() + 1), std::string(1 + pick(8), char(random())));
          break;
        case 2:  // cut the tail
          s.resize(pick(s.size() + 1));
          break;
        case 3:  // splice another seed's tail on
          {
          const std::string& other = seeds[pick(seeds.size())];
          s += other.substr(std::min(pick(16), other.size()));
          }
          break;
      }
    }
    drun::rdzv::fuzz::checkServerInput(s);  // aborts on a broken invariant
  }
  INFO(inputs << " mutated streams");
  CHECK(inputs >= 50);
  // Every mutated stream got a connection of its own (exchange() aborts when one is refused).
  CHECK(drun::rdzv::fuzz::fuzzServer().stats().connectionsAccepted >= size_t(inputs));
}

// What every fuzz target's check shares (rendezvous/fuzz, rendezvous/store/fuzz, launcher/fuzz): an invariant that
// breaks aborts, so libFuzzer records the input and the corpus replay test fails loudly.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace drun::fuzz {

inline void require(bool ok, const char* target, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "%s fuzz: invariant broken: %s\n", target, what);
    std::abort();
  }
}

// Feeds every file of a corpus directory (seeds and each crash once found) to `check`: how the
// ordinary build replays a fuzzer's corpus as a regression test. Returns the number of files.
template <typename Check>
size_t replayCorpus(const std::filesystem::path& dir, Check&& check) {
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    std::fprintf(stderr, "corpus: %s\n", entry.path().filename().c_str());  // names a crasher
    check(bytes.str());
    ++files;
  }
  return files;
}

}  // namespace drun::fuzz

// What every fuzz target's check shares (rendezvous/fuzz, launcher/fuzz): an invariant that
// breaks aborts, so libFuzzer records the input and the corpus replay test fails loudly.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace drun::fuzz {

inline void require(bool ok, const char* target, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "%s fuzz: invariant broken: %s\n", target, what);
    std::abort();
  }
}

}  // namespace drun::fuzz

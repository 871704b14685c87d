// What the SLURM hostlist fuzzer checks on one input, shared by the libFuzzer target
// (hostlist_fuzz.cpp) and the corpus replay test (launcher/tests/hostlist_corpus_test.cpp).
//
// SLURM_JOB_NODELIST is untrusted input. expandHostlist must, on any bytes, return or throw
// InvalidArgument with a message, never crash, hang or allocate beyond its bounds: an accepted
// list expands to 1..maxHosts names, none longer than maxNameLength.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "../../tests/support/fuzz_support.hpp"
#include "drun/common/error.hpp"
#include "drun/launcher/hostlist.hpp"

namespace drun::launch::fuzz {

inline void checkHostlistInput(std::string_view data) {
  // Small bounds keep each input fast; the checks are the same as with the defaults.
  HostlistOptions options;
  options.maxHosts = 4096;
  options.maxNameLength = 64;
  std::vector<std::string> names;
  try {
    names = expandHostlist(data, options);
  } catch (const InvalidArgument& e) {
    drun::fuzz::require(*e.what() != '\0', "hostlist", "a rejection says why");
    return;
  }
  drun::fuzz::require(!names.empty(), "hostlist", "an accepted list names a host");
  drun::fuzz::require(names.size() <= options.maxHosts, "hostlist", "at most maxHosts names");
  for (const auto& name : names)
    drun::fuzz::require(name.size() <= options.maxNameLength, "hostlist",
                        "no name longer than maxNameLength");
}

}  // namespace drun::launch::fuzz

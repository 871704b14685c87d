// What the command-line fuzzer checks on one input, shared by the libFuzzer target
// (cli_fuzz.cpp) and the corpus replay test (launcher/tests/cli_corpus_test.cpp).
//
// The input is split into argv on NUL bytes, after "drun" and before "--" "/bin/true", so the
// program always resolves without PATH lookups of fuzzed names mattering (parseCommandLine only
// stat()s the program; nothing is executed). parseCommandLine must return or throw UsageError
// with a message; never crash, hang or throw anything else; an accepted command line that is
// not --help/--version has a program to run and a consistent node range.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "../../tests/support/fuzz_support.hpp"
#include "drun/launcher/cli.hpp"

namespace drun::launch::fuzz {

inline std::vector<std::string> fuzzArgv(std::string_view data) {
  std::vector<std::string> args{"drun"};
  for (size_t start = 0; start <= data.size() && args.size() < 64;) {
    size_t nul = data.find('\0', start);
    if (nul == std::string_view::npos) nul = data.size();
    args.emplace_back(data.substr(start, nul - start));
    start = nul + 1;
  }
  args.emplace_back("--");
  args.emplace_back("/bin/true");
  return args;
}

inline void checkCliInput(std::string_view data) {
  CliResult result;
  try {
    result = parseCommandLine(fuzzArgv(data));
  } catch (const UsageError& e) {
    drun::fuzz::require(*e.what() != '\0', "cli", "a usage error says why");
    return;
  }
  if (result.printAndExit) return;
  const auto& c = result.config;
  drun::fuzz::require(!c.program.empty() && !c.program[0].empty(), "cli", "a program to run");
  drun::fuzz::require(c.nprocPerNode >= 1, "cli", "at least one worker per node");
  drun::fuzz::require(1 <= c.rendezvous.minNodes && c.rendezvous.minNodes <= c.rendezvous.maxNodes,
                      "cli", "1 <= min nodes <= max nodes");
}

}  // namespace drun::launch::fuzz

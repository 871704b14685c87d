// The `TAG rank=R key=value ...` lines the Python programs of the tests print (tests/torch,
// tests/python), read back from drun's console output with its rank prefixes. Header-only.
#pragma once

#include <map>
#include <regex>
#include <string>
#include <vector>

#include "process.hpp"

namespace drun::test {

// `KEY=VALUE` words of a line tagged `tag`, with the console's rank prefix.
struct Tagged {
  int consoleRank;
  std::map<std::string, std::string> fields;
  int rank() const { return std::stoi(fields.at("rank")); }
};

inline std::vector<Tagged> tagged(const std::string& out, const std::string& tag) {
  static const std::regex word(R"((\w+)=(\S+))");
  std::vector<Tagged> found;
  for (const auto& line : parseConsole(out)) {
    if (line.text.rfind(tag + " ", 0) != 0) continue;
    Tagged t{line.rank, {}};
    for (std::sregex_iterator it(line.text.begin(), line.text.end(), word), end; it != end; ++it)
      t.fields[(*it)[1]] = (*it)[2];
    if (t.fields.count("rank")) found.push_back(std::move(t));
  }
  return found;
}

}  // namespace drun::test

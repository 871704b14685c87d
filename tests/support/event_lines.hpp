// drun's event lines (--events FILE, docs/observe.md) read back: one JSON object a line.
// Header-only.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace drun::test {

inline std::vector<nlohmann::json> readEvents(const std::filesystem::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));  // a bad line fails the test here
  return out;
}

inline std::vector<nlohmann::json> ofKind(const std::vector<nlohmann::json>& events, const std::string& kind) {
  std::vector<nlohmann::json> out;
  for (const nlohmann::json& e : events)
    if (e["event"] == kind) out.push_back(e);
  return out;
}

}  // namespace drun::test

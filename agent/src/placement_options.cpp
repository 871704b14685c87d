// The placement options' values, parsed without the machinery that applies them (hwloc, the
// worker environment): the command line's parser and its fuzz target use them alone.
#include "drun/agent/numa_binding.hpp"
#include "drun/agent/worker_env.hpp"

namespace drun::agent {

std::optional<NumaMode> parseNumaMode(std::string_view text) {
  if (text == "node") return NumaMode::Node;
  if (text == "socket") return NumaMode::Socket;
  if (text == "exclusive") return NumaMode::Exclusive;
  if (text == "core-complex") return NumaMode::CoreComplex;
  return std::nullopt;
}

const char* toString(NumaMode mode) {
  switch (mode) {
    case NumaMode::Off: return "off";
    case NumaMode::Node: return "node";
    case NumaMode::Socket: return "socket";
    case NumaMode::Exclusive: return "exclusive";
    case NumaMode::CoreComplex: return "core-complex";
  }
  return "?";
}

std::vector<std::string> splitDeviceList(const std::string& list) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (;;) {
    size_t end = list.find(',', begin);
    std::string item = list.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    const size_t first = item.find_first_not_of(" \t\n\r\f\v");
    const size_t last = item.find_last_not_of(" \t\n\r\f\v");
    out.push_back(first == std::string::npos ? "" : item.substr(first, last - first + 1));
    if (end == std::string::npos) return out;
    begin = end + 1;
  }
}

}  // namespace drun::agent

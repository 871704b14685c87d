// The recovery_worker's lines read back (tests/recovery/recovery_worker.cpp: "RW start", "RW done"),
// for the in-process recovery end-to-end tests (recovery_e2e_test.cpp, recovery_node_e2e_test.cpp).
// Header-only.
#pragma once

#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "process.hpp"

namespace drun::test {

// One "RW start" line: a worker process started with these ranks, generation and restart count.
struct Start {
  int rank, local, gen, restart;
  long pid;
};

// The "RW start" lines of a run's stdout, in order.
inline std::vector<Start> starts(const std::string& out) {
  static const std::regex re(R"(RW start rank=(\d+) local=(\d+) pid=(\d+) gen=(\d+) restart=(\d+))");
  std::vector<Start> found;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    found.push_back({std::stoi((*it)[1]), std::stoi((*it)[2]), std::stoi((*it)[4]), std::stoi((*it)[5]),
                     std::stol((*it)[3])});
  return found;
}

// rank -> pid of its "RW done" line.
inline std::map<int, long> donePids(const std::string& out) {
  static const std::regex re(R"(RW done rank=(\d+) pid=(\d+))");
  std::map<int, long> done;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    done[std::stoi((*it)[1])] = std::stol((*it)[2]);
  return done;
}

// recovery_worker with `args`: a worker program for drun.
inline std::vector<std::string> recoveryWorker(std::vector<std::string> args) {
  args.insert(args.begin(), helperPath("recovery_worker").string());
  return args;
}

// The event lines of `kind` in an --events file.
inline std::vector<std::string> eventsOf(const std::filesystem::path& file, const std::string& kind) {
  std::vector<std::string> out;
  for (const std::string& line : splitLines(slurp(file)))
    if (contains(line, "\"event\":\"" + kind + "\"")) out.push_back(line);
  return out;
}

}  // namespace drun::test

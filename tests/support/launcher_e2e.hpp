// Helpers of the single-node launcher's end-to-end tests (launcher_*e2e_test.cpp, signals_e2e):
// the helper workers' paths, drun's console and failure summary read back, the usage-error check.
#pragma once

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "process.hpp"

namespace drun::test {

inline std::string behave() { return helperPath("behave").string(); }
inline std::string envDump() { return helperPath("env_dump").string(); }

inline std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline std::vector<std::string> linesStartingWith(const std::string& text, const std::string& prefix) {
  std::vector<std::string> found;
  for (auto& l : splitLines(text))
    if (l.rfind(prefix, 0) == 0) found.push_back(l);
  return found;
}

inline std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// Lines a worker wrote, by console rank, for one stream.
inline std::map<int, std::vector<std::string>> linesByRank(const std::string& stream) {
  std::map<int, std::vector<std::string>> by;
  for (auto& l : parseConsole(stream)) by[l.rank].push_back(l.text);
  return by;
}

inline bool hasLine(const std::vector<std::string>& lines, const std::string& line) {
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

inline size_t cpuCountOnline() { return static_cast<size_t>(::sysconf(_SC_NPROCESSORS_ONLN)); }
inline size_t cpuCountAffinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return cpuCountOnline();
  return static_cast<size_t>(CPU_COUNT(&set));
}

// Bad input: exit 2, exactly one "drun: error:" line that names the problem (one of `keywords`,
// case-insensitive), nothing started (the marker directory stays empty, no process carries the
// marker).
inline void expectUsageError(const RunResult& r, const std::vector<std::string>& keywords,
                      const TempDir& startedDir, const MarkerScope& marker) {
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 2);
  auto errors = linesStartingWith(r.err, "drun: error:");
  CHECK(errors.size() == 1);
  CHECK(splitLines(r.err).size() >= 1);
  if (!splitLines(r.err).empty()) CHECK(splitLines(r.err).front().rfind("drun: error:", 0) == 0);
  if (!errors.empty()) {
    bool named = false;
    for (auto& k : keywords) named = named || contains(lower(errors.front()), lower(k));
    INFO("the message should name one of the keywords");
    CHECK(named);
  }
  CHECK(std::filesystem::is_empty(startedDir.path()));
  CHECK(marker.leftovers(std::chrono::seconds(2)).empty());
}

// Program that proves it started: behave touch:<dir>/started.{rank}.
inline std::vector<std::string> touchProgram(const TempDir& dir) {
  return {behave(), "touch:" + (dir / "started.{rank}").string()};
}

// The failure summary's lines (drun's stderr lines starting with "drun:").
struct Summary {
  std::vector<std::string> lines;  // all stderr lines, in order
  // Index of the first line starting with prefix, or -1.
  int find(const std::string& prefix) const {
    for (size_t i = 0; i < lines.size(); ++i)
      if (lines[i].rfind(prefix, 0) == 0) return static_cast<int>(i);
    return -1;
  }
};

// The "root cause" line and the "time" line right after it.
inline void expectRootCause(const RunResult& r, const std::string& rootCauseLine) {
  INFO(r.describe());
  Summary s{splitLines(r.err)};
  int cause = s.find("drun: root cause:");
  REQUIRE(cause >= 0);
  CHECK(s.lines[cause] == rootCauseLine);
  // Then, among the summary's indented lines (drun may add some, e.g. the pid), the time.
  std::regex iso(R"(drun:   time: \d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|\+00:00))");
  bool timed = false;
  for (size_t i = cause + 1; i < s.lines.size() && s.lines[i].rfind("drun:  ", 0) == 0; ++i)
    timed = timed || std::regex_match(s.lines[i], iso);
  CHECK(timed);
  CHECK(linesStartingWith(r.err, "drun: root cause:").size() == 1);
}

// The lines after `header` (a summary line) indented deeper than it, i.e. its body. Lines may
// carry the "drun:" prefix or not.
inline std::vector<std::string> indentedAfter(const RunResult& r, const std::string& header) {
  auto indentOf = [](const std::string& line) {
    size_t start = line.rfind("drun:", 0) == 0 ? 5 : 0;
    size_t text = line.find_first_not_of(" \t", start);
    return text == std::string::npos ? std::string::npos : text - start;
  };
  Summary s{splitLines(r.err)};
  std::vector<std::string> body;
  int at = s.find(header);
  if (at < 0) return body;
  size_t headerIndent = indentOf(s.lines[at]);
  for (size_t i = at + 1; i < s.lines.size(); ++i) {
    size_t indent = indentOf(s.lines[i]);
    if (indent == std::string::npos || indent <= headerIndent) break;
    body.push_back(s.lines[i]);
  }
  return body;
}

inline std::string rootCause(int rank, const std::string& what) {
  return "drun: root cause: rank " + std::to_string(rank) + " (local_rank " + std::to_string(rank) +
         ") on " + hostName() + " " + what;
}

// Signals `job` and waits (hang guard 20 s): its result and how long it took to end.
struct Ended {
  RunResult result;
  std::chrono::steady_clock::duration took;
};
inline Ended signalAndWait(Process& job, int signal) {
  auto signalled = std::chrono::steady_clock::now();
  job.signal(signal);
  RunResult r = job.wait(std::chrono::seconds(20));
  return {r, std::chrono::steady_clock::now() - signalled};
}

}  // namespace drun::test

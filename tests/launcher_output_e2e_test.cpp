// End-to-end tests of the single-node launcher: worker output on the console and in log files.
// build/bin/drun run as a user runs it, with the helper workers in build/tests/helpers; each
// scenario is its own TEST_CASE so CTest runs them in parallel, and every drun run carries a
// unique marker variable (MarkerScope) that proves nothing outlives drun (launcher_e2e_test.cpp
// says more).
#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "drun/common/test_skip.hpp"
#include "launcher_e2e.hpp"
#include "process.hpp"

namespace fs = std::filesystem;
using namespace drun::test;
using namespace std::chrono_literals;

// ============================================================================================
// Output
// ============================================================================================

TEST_CASE("worker stdout goes to stdout and stderr to stderr prefixed by rank", "[e2e]") {
  MarkerScope marker;
  auto r = run(drunCommand({"--nproc-per-node", "3", behave(), "out:to-out {rank}",
                            "err:to-err {rank}", "out:again {rank}"},
                           {marker.env()}));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  for (int rank = 0; rank < 3; ++rank) {
    std::string rs = std::to_string(rank);
    auto outLines = linesStartingWith(r.out, "[" + rs + "]:");
    CHECK(outLines == std::vector<std::string>{"[" + rs + "]:to-out " + rs, "[" + rs + "]:again " + rs});
    CHECK(linesStartingWith(r.err, "[" + rs + "]:") ==
          std::vector<std::string>{"[" + rs + "]:to-err " + rs});
  }
  CHECK(splitLines(r.out).size() == 6);  // nothing else on stdout
}

TEST_CASE("console prefix: none for one worker and prefix templates and an empty prefix", "[e2e]") {
  MarkerScope marker;
  SECTION("one worker: no prefix") {
    auto r = run(drunCommand({behave(), "out:alone"}, {marker.env()}));
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    CHECK(r.out == "alone\n");
  }
  SECTION("--prefix '' turns it off") {
    auto r = run(drunCommand({"--prefix", "", "--nproc-per-node", "2", behave(), "out:x{rank}"},
                             {marker.env()}));
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    auto lines = splitLines(r.out);
    std::sort(lines.begin(), lines.end());
    CHECK(lines == std::vector<std::string>{"x0", "x1"});
  }
  SECTION("macros") {
    auto r = run(drunCommand({"--prefix", "${role_name}/${rank}/${local_rank}@${hostname}| ", "--role",
                              "trainer", "--nproc-per-node", "2", behave(), "out:x{rank}"},
                             {marker.env()}));
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    auto lines = splitLines(r.out);
    std::sort(lines.begin(), lines.end());
    CHECK(lines == std::vector<std::string>{"trainer/0/0@" + hostName() + "| x0",
                                            "trainer/1/1@" + hostName() + "| x1"});
  }
  SECTION("a prefix for one worker when asked") {
    auto r = run(drunCommand({"--prefix", "[${rank}]:", behave(), "out:alone"}, {marker.env()}));
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    CHECK(r.out == "[0]:alone\n");
  }
}

namespace {
// Checks that every console line of `stream` is "[r]:" + one complete line_writer line of rank r,
// and that each rank's lines are all there, in order. Returns the number of lines per rank.
std::map<int, long> checkWholeLines(const std::string& stream, int ranks) {
  std::map<int, long> next;
  long bad = 0;
  std::string firstBad;
  for (auto& l : parseConsole(stream)) {
    // "<r>:<i>:<len>:payload"
    std::smatch m;
    static const std::regex header(R"(^(\d+):(\d+):(\d+):)");
    bool ok = l.rank >= 0 && l.rank < ranks && std::regex_search(l.text, m, header);
    if (ok) {
      long r = std::stol(m[1]), i = std::stol(m[2]), len = std::stol(m[3]);
      ok = r == l.rank && static_cast<long>(l.text.size()) == len && i == next[r];
      for (long j = static_cast<long>(m[0].length()); ok && j < len; ++j)
        ok = l.text[j] == static_cast<char>('a' + (r * 131 + i * 31 + j) % 26);
      if (ok) next[r] = i + 1;
    }
    if (!ok && bad++ == 0) firstBad = "rank " + std::to_string(l.rank) + ": " + l.text.substr(0, 120);
  }
  INFO("first bad line (of " << bad << "): " << firstBad);
  CHECK(bad == 0);
  return next;
}
}  // namespace

TEST_CASE("8 workers writing long lines concurrently: no line is interleaved or cut", "[e2e]") {
  MarkerScope marker;
  const int n = 8;
  const long lines = 200;
  SECTION("stdout") {
    auto r = run(drunCommand({"--nproc-per-node", std::to_string(n), helperPath("line_writer").string(),
                              std::to_string(lines), "8192", "32768"},
                             {marker.env()}, 90s));
    INFO("status " << r.status() << " wall " << r.wall.count() << " ms, stderr: " << r.err.substr(0, 2000));
    REQUIRE_FALSE(r.timedOut);
    REQUIRE(r.status() == 0);
    auto counts = checkWholeLines(r.out, n);
    for (int rank = 0; rank < n; ++rank) CHECK(counts[rank] == lines);
  }
  SECTION("stdout and stderr alternately") {
    auto r = run(drunCommand({"--nproc-per-node", std::to_string(n), helperPath("line_writer").string(),
                              "100", "8192", "32768", "both"},
                             {marker.env()}, 90s));
    REQUIRE_FALSE(r.timedOut);
    REQUIRE(r.status() == 0);
    // Each stream separately: even line numbers on stdout, odd on stderr. Re-number to check order.
    for (auto* stream : {&r.out, &r.err}) {
      std::map<int, long> seen;
      long bad = 0;
      for (auto& l : parseConsole(*stream)) {
        if (l.rank < 0 && stream == &r.err) continue;  // drun's own notes (e.g. OMP_NUM_THREADS)
        std::smatch m;
        static const std::regex header(R"(^(\d+):(\d+):(\d+):)");
        bool ok = l.rank >= 0 && std::regex_search(l.text, m, header) && std::stol(m[1]) == l.rank &&
                  static_cast<long>(l.text.size()) == std::stol(m[3]);
        bad += !ok;
        if (ok) ++seen[l.rank];
      }
      CHECK(bad == 0);
      for (int rank = 0; rank < n; ++rank) CHECK(seen[rank] == 50);
    }
  }
}

TEST_CASE("1 MiB lines and a last line without a newline pass through whole", "[e2e]") {
  MarkerScope marker;
  SECTION("1 MiB lines") {
    auto r = run(drunCommand({"--nproc-per-node", "2", helperPath("line_writer").string(), "3",
                              "1048576", "1048576"},
                             {marker.env()}, 60s));
    REQUIRE_FALSE(r.timedOut);
    REQUIRE(r.status() == 0);
    auto counts = checkWholeLines(r.out, 2);
    CHECK(counts[0] == 3);
    CHECK(counts[1] == 3);
  }
  SECTION("no newline at the end") {
    auto r = run(drunCommand({"--nproc-per-node", "2", behave(), "out:first {rank}",
                              "outraw:unterminated {rank}"},
                             {marker.env()}));
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    auto by = linesByRank(r.out);
    for (int rank = 0; rank < 2; ++rank) {
      std::string s = std::to_string(rank);
      CHECK(by[rank] == std::vector<std::string>{"first " + s, "unterminated " + s});
    }
    CHECK(r.out.back() == '\n');  // drun ends the cut line, so the next one starts clean
  }
}

TEST_CASE("local-ranks-filter limits what reaches the console", "[e2e]") {
  MarkerScope marker;
  auto r = run(drunCommand({"--nproc-per-node", "4", "--local-ranks-filter", "0,2", behave(),
                            "out:o{rank}", "err:e{rank}"},
                           {marker.env()}));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  auto out = linesByRank(r.out);
  auto err = linesByRank(r.err);
  CHECK(out.size() == 2);
  CHECK(out[0] == std::vector<std::string>{"o0"});
  CHECK(out[2] == std::vector<std::string>{"o2"});
  CHECK(err.count(1) == 0);
  CHECK(err.count(3) == 0);
  CHECK(hasLine(err[0], "e0"));
  CHECK(hasLine(err[2], "e2"));
}

namespace {
// The only run directory under a --log-dir.
fs::path runDir(const fs::path& logDir) {
  std::vector<fs::path> dirs;
  for (auto& e : fs::directory_iterator(logDir))
    if (e.is_directory()) dirs.push_back(e.path());
  REQUIRE(dirs.size() == 1);
  return dirs.front();
}
}  // namespace

TEST_CASE("log-dir writes run/node/attempt_n/local_rank/stdout.log and stderr.log", "[e2e]") {
  MarkerScope marker;
  TempDir logs;
  auto r = run(drunCommand({"--nproc-per-node", "2", "--log-dir", logs.path().string(), behave(),
                            "env:TORCHELASTIC_RUN_ID", "out:hello {rank}", "err:oops {rank}"},
                           {marker.env()}));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  auto dir = runDir(logs.path());
  // Without --rdzv-id the run gets a directory of its own, as torchrun's none_<random>, and drun
  // says where it is.
  CHECK(dir.filename().string().rfind("none_", 0) == 0);
  CHECK(contains(r.err, "drun: log files go to " + dir.string()));
  auto by = linesByRank(r.out);
  CHECK(hasLine(by[0], "TORCHELASTIC_RUN_ID=none"));
  for (int lr = 0; lr < 2; ++lr) {
    auto rankDir = dir / "node0" / "attempt_0" / std::to_string(lr);
    INFO(rankDir);
    std::string s = std::to_string(lr);
    CHECK(slurp(rankDir / "stdout.log") == "TORCHELASTIC_RUN_ID=none\nhello " + s + "\n");
    CHECK(slurp(rankDir / "stderr.log") == "oops " + s + "\n");
    // Default routing: the console still gets everything.
    CHECK(hasLine(by[lr], "hello " + s));
    CHECK(hasLine(linesByRank(r.err)[lr], "oops " + s));
  }
}

TEST_CASE("every run has its own log directory and reads only its own error files", "[e2e]") {
  MarkerScope marker;
  TempDir logs;
  const std::string dir = logs.path().string();
  SECTION("without --rdzv-id: two runs, two directories") {
    for (int i = 0; i < 2; ++i) {
      auto r = run(drunCommand({"--log-dir", dir, behave(), "out:run"}, {marker.env()}));
      INFO(r.describe());
      REQUIRE(r.status() == 0);
    }
    int runs = 0;
    for (auto& e : fs::directory_iterator(logs.path())) runs += e.is_directory() ? 1 : 0;
    CHECK(runs == 2);
  }
  SECTION("with the same --rdzv-id: the second run's summary shows its own failure") {
    auto first = run(drunCommand({"--log-dir", dir, "--rdzv-id", "job7", behave(),
                                  "errorfile:ValueError: from the first run", "exit:1"},
                                 {marker.env()}));
    INFO(first.describe());
    REQUIRE(first.status() == 1);
    const fs::path errorFile = logs.path() / "job7" / "node0" / "attempt_0" / "0" / "error.json";
    CHECK(fs::exists(errorFile));  // the summary's path outlives drun
    CHECK(contains(first.err, "drun:   error file " + errorFile.string() + ":"));
    auto second = run(drunCommand({"--log-dir", dir, "--rdzv-id", "job7", behave(), "exit:7"},
                                  {marker.env()}));
    INFO(second.describe());
    CHECK(second.status() == 7);
    expectRootCause(second, rootCause(0, "exited with code 7"));
    CHECK_FALSE(contains(second.err, "from the first run"));
  }
}

TEST_CASE("redirects without --log-dir go to a kept temporary directory named on stderr", "[e2e]") {
  MarkerScope marker;
  TempDir tmp;
  auto r = run(drunCommand({"--nproc-per-node", "2", "-r", "3", behave(), "out:o{rank}", "err:e{rank}"},
                           {marker.env(), "TMPDIR=" + tmp.path().string()}));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  CHECK(linesByRank(r.out).empty());
  auto dir = runDir(tmp.path());
  CHECK(contains(r.err, "drun: log files go to " + dir.string() + " (--redirects/--tee without --log-dir)"));
  CHECK(slurp(dir / "node0" / "attempt_0" / "1" / "stdout.log") == "o1\n");
  CHECK(slurp(dir / "node0" / "attempt_0" / "0" / "stderr.log") == "e0\n");
}

TEST_CASE("redirects and tee route streams to files and/or the console", "[e2e]") {
  MarkerScope marker;
  TempDir logs;
  auto runWith = [&](std::vector<std::string> routing) {
    auto args = concat({"--nproc-per-node", "2", "--log-dir", logs.path().string()}, routing);
    args = concat(args, {behave(), "out:o{rank}", "err:e{rank}"});
    auto r = run(drunCommand(args, {marker.env()}));
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    return r;
  };
  auto fileOf = [&](int lr, const std::string& stream) {
    return slurp(runDir(logs.path()) / "node0" / "attempt_0" / std::to_string(lr) / (stream + ".log"));
  };
  SECTION("-r 3: both streams only in the files") {
    auto r = runWith({"-r", "3"});
    CHECK(linesByRank(r.out).empty());
    auto err = linesByRank(r.err);
    CHECK(err.count(0) == 0);
    CHECK(err.count(1) == 0);
    CHECK(fileOf(0, "stdout") == "o0\n");
    CHECK(fileOf(1, "stderr") == "e1\n");
  }
  SECTION("--redirects 1: stdout to files, stderr still on the console") {
    auto r = runWith({"--redirects", "1"});
    CHECK(linesByRank(r.out).empty());
    CHECK(hasLine(linesByRank(r.err)[1], "e1"));
    CHECK(fileOf(1, "stdout") == "o1\n");
  }
  SECTION("-t 3: files and console") {
    auto r = runWith({"-t", "3"});
    CHECK(linesByRank(r.out)[0] == std::vector<std::string>{"o0"});
    CHECK(hasLine(linesByRank(r.err)[1], "e1"));
    CHECK(fileOf(0, "stdout") == "o0\n");
    CHECK(fileOf(1, "stderr") == "e1\n");
  }
  SECTION("per-rank map -r 0:3,1:2") {
    auto r = runWith({"-r", "0:3,1:2"});
    auto out = linesByRank(r.out);
    auto err = linesByRank(r.err);
    CHECK(out.count(0) == 0);
    CHECK(err.count(0) == 0);
    CHECK(out[1] == std::vector<std::string>{"o1"});
    CHECK(err.count(1) == 0);
    CHECK(fileOf(0, "stdout") == "o0\n");
    CHECK(fileOf(1, "stderr") == "e1\n");
  }
  SECTION("--tee with the per-rank map") {
    auto r = runWith({"--tee", "0:1,1:2"});
    CHECK(linesByRank(r.out)[0] == std::vector<std::string>{"o0"});
    CHECK(fileOf(0, "stdout") == "o0\n");
    CHECK(fileOf(1, "stderr") == "e1\n");
  }
}

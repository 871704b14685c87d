// End-to-end tests of the single-node launcher: exit codes, the failure summary, restarts, and
// malformed error files.
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
// Exit codes and the failure summary
// ============================================================================================

TEST_CASE("all workers succeed: exit 0 and no failure summary", "[e2e]") {
  MarkerScope marker;
  auto r = run(drunCommand({"--nproc-per-node", "4", behave(), "out:ok"}, {marker.env()}));
  INFO(r.describe());
  CHECK(r.status() == 0);
  CHECK_FALSE(contains(r.err, "root cause"));
  CHECK(marker.leftovers(2s).empty());
}

TEST_CASE("a worker's exit code is drun's and the summary names it and its stderr", "[e2e]") {
  MarkerScope marker;
  auto r = run(drunCommand({"--nproc-per-node", "2", behave(), "err:first words@rank=1",
                            "err:boom-unique-tail-line@rank=1", "exit:3@rank=1", "sleep:60000"},
                           {marker.env()}));
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 3);
  expectRootCause(r, rootCause(1, "exited with code 3"));
  Summary s{splitLines(r.err)};
  CHECK(s.find("drun:   last lines of stderr:") > s.find("drun: root cause:"));
  auto tail = indentedAfter(r, "drun:   last lines of stderr:");
  INFO("tail lines: " << tail.size());
  bool found = false;
  for (auto& l : tail) found = found || contains(l, "boom-unique-tail-line");
  CHECK(found);
  CHECK(r.wall < 10s);  // the sleeping rank 0 was stopped at once
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("a single worker exiting 3 makes drun exit 3", "[e2e]") {
  MarkerScope marker;
  auto r = run(drunCommand({behave(), "exit:3"}, {marker.env()}));
  INFO(r.describe());
  CHECK(r.status() == 3);
  expectRootCause(r, rootCause(0, "exited with code 3"));
}

TEST_CASE("a worker killed by SIGSEGV: exit 139 and the summary names SIGSEGV", "[e2e]") {
  MarkerScope marker;
  auto r = run(drunCommand({"--nproc-per-node", "2", behave(), "raise:SEGV@rank=0", "sleep:60000"},
                           {marker.env()}));
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 139);
  expectRootCause(r, rootCause(0, "was killed by signal SIGSEGV (11)"));
  CHECK(r.wall < 10s);
  SECTION("a shell worker doing kill -SEGV $$") {
    auto r2 = run(drunCommand({"sh", "-c", "kill -SEGV $$"}, {marker.env()}));
    INFO(r2.describe());
    CHECK(r2.status() == 139);
    expectRootCause(r2, rootCause(0, "was killed by signal SIGSEGV (11)"));
  }
}

TEST_CASE("the first worker to fail is the root cause and the others are stopped at once", "[e2e]") {
  MarkerScope marker;
  // Rank 2 fails at once. Rank 1 would fail later with another code (it must be stopped before),
  // ranks 0 and 3 sleep: none of them may keep drun alive or become the root cause.
  auto r = run(drunCommand({"--nproc-per-node", "4", behave(), "exit:5@rank=2", "sleep:3000@rank=1",
                            "exit:9@rank=1", "sleep:60000"},
                           {marker.env()}));
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 5);
  expectRootCause(r, rootCause(2, "exited with code 5"));
  // Ranks 0 and 3 sleep a minute: a drun that did not stop them would still be waiting (how fast
  // it stops them is the launch benchmark's to measure, not this test's).
  CHECK(r.wall < 30s);
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("the error file's message is the root cause", "[e2e]") {
  MarkerScope marker;
  SECTION("torch @record format") {
    auto r = run(drunCommand({"--nproc-per-node", "2", behave(), "env:TORCHELASTIC_ERROR_FILE",
                              "errorfile:ValueError: learning rate is negative@rank=1",
                              "err:not the root cause@rank=1", "exit:1@rank=1", "sleep:60000"},
                             {marker.env()}));
    INFO(r.describe());
    REQUIRE_FALSE(r.timedOut);
    CHECK(r.status() == 1);
    expectRootCause(r, rootCause(1, "exited with code 1"));
    std::string errorFile;
    auto out = linesByRank(r.out);
    for (auto& l : out[1])
      if (l.rfind("TORCHELASTIC_ERROR_FILE=", 0) == 0) errorFile = l.substr(24);
    REQUIRE_FALSE(errorFile.empty());
    // Without --log-dir the file is gone when drun exits: the summary names no path.
    CHECK_FALSE(fs::exists(errorFile));
    CHECK_FALSE(contains(r.err, errorFile));
    auto header = std::string("drun:   error file:");
    CHECK(Summary{splitLines(r.err)}.find(header) >= 0);
    auto body = indentedAfter(r, header);
    bool found = false;
    for (auto& l : body) found = found || contains(l, "ValueError: learning rate is negative");
    CHECK(found);
  }
  SECTION("plain {\"message\": \"...\"}") {
    auto r = run(drunCommand({behave(), "errorfile-plain:plain message from worker", "exit:1"},
                             {marker.env()}));
    INFO(r.describe());
    CHECK(r.status() == 1);
    CHECK(Summary{splitLines(r.err)}.find("drun:   error file:") >= 0);
    bool found = false;
    for (auto& l : splitLines(r.err))
      found = found || (contains(l, "plain message from worker") && l.rfind("drun:   error file", 0) != 0);
    CHECK(found);
  }
}

// ============================================================================================
// Restarts
// ============================================================================================

TEST_CASE("max-restarts 2: fails on attempts 0 and 1 and succeeds on 2", "[e2e]") {
  MarkerScope marker;
  auto r = run(drunCommand({"--max-restarts", "2", "--nproc-per-node", "2", behave(),
                            "env:TORCHELASTIC_RESTART_COUNT@rank=0",
                            "env:TORCHELASTIC_ERROR_FILE@rank=0", "exit:1@rank=0@restart=0,1",
                            "sleep:60000@rank=1@restart=0,1", "env:TORCHELASTIC_RESTART_COUNT@rank=1",
                            "env:TORCHELASTIC_ERROR_FILE@rank=1"},
                           {marker.env()}));
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  auto by = linesByRank(r.out);
  std::vector<std::string> counts0, files;
  for (auto& l : by[0]) {
    if (l.rfind("TORCHELASTIC_RESTART_COUNT=", 0) == 0) counts0.push_back(l.substr(27));
    if (l.rfind("TORCHELASTIC_ERROR_FILE=", 0) == 0) files.push_back(l.substr(24));
  }
  CHECK(counts0 == std::vector<std::string>{"0", "1", "2"});
  CHECK(hasLine(by[1], "TORCHELASTIC_RESTART_COUNT=2"));
  for (auto& l : by[1])
    if (l.rfind("TORCHELASTIC_ERROR_FILE=", 0) == 0) files.push_back(l.substr(24));
  CHECK(files.size() == 4);
  CHECK(std::set<std::string>(files.begin(), files.end()).size() == files.size());  // per attempt
  CHECK(r.wall < 10s);
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("restart budget exhausted: the failure's exit code after exactly K+1 attempts", "[e2e]") {
  MarkerScope marker;
  TempDir dir;
  auto attempts = dir / "attempts";
  auto r = run(drunCommand({"--max-restarts", "2", "--nproc-per-node", "2", behave(),
                            "append:" + attempts.string() + "@rank=0", "exit:4@rank=0", "sleep:60000"},
                           {marker.env()}));
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 4);
  CHECK(slurp(attempts) == "rank=0 restart=0\nrank=0 restart=1\nrank=0 restart=2\n");
  expectRootCause(r, rootCause(0, "exited with code 4"));
  CHECK(r.wall < 10s);
  CHECK(marker.leftovers(5s).empty());
  SECTION("default budget 0: one attempt") {
    fs::remove(attempts);
    auto r2 = run(drunCommand({behave(), "append:" + attempts.string(), "exit:4"}, {marker.env()}));
    INFO(r2.describe());
    CHECK(r2.status() == 4);
    CHECK(slurp(attempts) == "rank=0 restart=0\n");
  }
}

// ============================================================================================
// Malformed error files
// ============================================================================================

TEST_CASE("a malformed error file: exit 1, a summary that says so, no temporary directory left",
          "[e2e]") {
  MarkerScope marker;
  TempDir tmp;  // drun's TMPDIR: its temporary job directory (holding the error files) goes here
  std::string content = GENERATE(as<std::string>{}, R"({"message":{"message":1}})",
                                 "\x7f" "ELF binary \x01\x02\xff garbage", R"({"message":[)");
  CAPTURE(content);
  auto r = run(drunCommand({"sh", "-c",
                            "printf '%s' \"$CONTENT\" > \"$TORCHELASTIC_ERROR_FILE\"; "
                            "echo last-words-before-exit >&2; exit 1"},
                           {marker.env(), "TMPDIR=" + tmp.path().string(), "CONTENT=" + content}));
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 1);
  expectRootCause(r, rootCause(0, "exited with code 1"));
  // "drun:   error file <path> is malformed: <what>; last lines of stderr:", then the tail.
  Summary s{splitLines(r.err)};
  int header = s.find("drun:   error file ");
  REQUIRE(header >= 0);
  CHECK(contains(s.lines[header], " is malformed: "));
  auto tail = indentedAfter(r, "drun:   error file ");
  bool found = false;
  for (auto& l : tail) found = found || contains(l, "last-words-before-exit");
  CHECK(found);
  CHECK_FALSE(contains(r.err, "terminate called"));
  CHECK(fs::is_empty(tmp.path()));
  CHECK(marker.leftovers(2s).empty());
}

TEST_CASE("a failed Python job names the interpreter that ran it", "[e2e]") {
  if (!fs::exists("/usr/bin/python3")) skipTest("no /usr/bin/python3");
  MarkerScope marker;
  auto r = run(drunCommand({"-m", "drun_no_such_module_xyz"}, {marker.env(), "PYTHON_EXEC=/usr/bin/python3"}));
  INFO(r.describe());
  CHECK(r.status() == 1);
  CHECK(contains(r.err, "No module named"));
  CHECK(contains(r.err, "drun:   python on this node: /usr/bin/python3 (PYTHON_EXEC)"));
  auto missing = run(drunCommand({"-m", "json.tool"}, {"PYTHON_EXEC=/nonexistent/python"}));
  INFO(missing.describe());
  CHECK(missing.status() == 2);
  CHECK(contains(missing.err, "python interpreter (PYTHON_EXEC): program '/nonexistent/python' not found"));
}

// End-to-end tests of the single-node launcher: build/bin/drun run as a user runs it, with the
// helper workers in build/tests/helpers (env_dump, behave, line_writer). Each scenario is its own
// TEST_CASE so CTest runs them in parallel. Every drun run carries a unique marker variable
// (MarkerScope), which drun passes on to its workers: the tests use it to prove that nothing
// outlives drun, and to sweep up after a broken drun.
//
// The CLI contract tested here is the one in the launcher's task description (torchrun spellings,
// PET_* variables, exit codes, summary lines, "drun: error:" for bad input with exit code 2).
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
#include "process.hpp"

namespace fs = std::filesystem;
using namespace drun::test;
using namespace std::chrono_literals;

namespace {

std::string behave() { return helperPath("behave").string(); }
std::string envDump() { return helperPath("env_dump").string(); }

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<std::string> linesStartingWith(const std::string& text, const std::string& prefix) {
  std::vector<std::string> found;
  for (auto& l : splitLines(text))
    if (l.rfind(prefix, 0) == 0) found.push_back(l);
  return found;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// Lines a worker wrote, by console rank, for one stream.
std::map<int, std::vector<std::string>> linesByRank(const std::string& stream) {
  std::map<int, std::vector<std::string>> by;
  for (auto& l : parseConsole(stream)) by[l.rank].push_back(l.text);
  return by;
}

bool hasLine(const std::vector<std::string>& lines, const std::string& line) {
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

size_t cpuCountOnline() { return static_cast<size_t>(::sysconf(_SC_NPROCESSORS_ONLN)); }
size_t cpuCountAffinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return cpuCountOnline();
  return static_cast<size_t>(CPU_COUNT(&set));
}

// Bad input: exit 2, exactly one "drun: error:" line that names the problem (one of `keywords`,
// case-insensitive), nothing started (the marker directory stays empty, no process carries the
// marker).
void expectUsageError(const RunResult& r, const std::vector<std::string>& keywords,
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
  CHECK(fs::is_empty(startedDir.path()));
  CHECK(marker.leftovers(2s).empty());
}

// Program that proves it started: behave touch:<dir>/started.{rank}.
std::vector<std::string> touchProgram(const TempDir& dir) {
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
void expectRootCause(const RunResult& r, const std::string& rootCauseLine) {
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
std::vector<std::string> indentedAfter(const RunResult& r, const std::string& header) {
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

std::string rootCause(int rank, const std::string& what) {
  return "drun: root cause: rank " + std::to_string(rank) + " (local_rank " + std::to_string(rank) +
         ") on " + hostName() + " " + what;
}

// Signals `job` and waits (hang guard 20 s): its result and how long it took to end.
struct Ended {
  RunResult result;
  std::chrono::steady_clock::duration took;
};
Ended signalAndWait(Process& job, int signal) {
  auto signalled = std::chrono::steady_clock::now();
  job.signal(signal);
  RunResult r = job.wait(20s);
  return {r, std::chrono::steady_clock::now() - signalled};
}

}  // namespace

// ============================================================================================
// Argument parsing and bad input
// ============================================================================================

TEST_CASE("bad input: an unknown option is rejected before anything starts", "[e2e]") {
  MarkerScope marker;
  TempDir started;
  auto r = run(drunCommand(concat({"--frobnicate", "--nproc-per-node", "2"}, touchProgram(started)),
                           {marker.env()}));
  expectUsageError(r, {"--frobnicate", "frobnicate"}, started, marker);
}

TEST_CASE("bad input: nproc-per-node 0 or negative or garbage is rejected", "[e2e]") {
  for (std::string bad : {"0", "-1", "-4", "abc", "4x", "1.5", ""}) {
    DYNAMIC_SECTION("--nproc-per-node '" << bad << "'") {
      MarkerScope marker;
      TempDir started;
      auto r = run(drunCommand(concat({"--nproc-per-node", bad}, touchProgram(started)),
                               {marker.env()}));
      expectUsageError(r, {"nproc", bad.empty() ? "nproc" : bad}, started, marker);
    }
  }
}

TEST_CASE("bad input: garbage PET_NPROC_PER_NODE is rejected", "[e2e]") {
  MarkerScope marker;
  TempDir started;
  auto r = run(drunCommand(touchProgram(started), {marker.env(), "PET_NPROC_PER_NODE=lots"}));
  expectUsageError(r, {"PET_NPROC_PER_NODE", "nproc", "lots"}, started, marker);
}

TEST_CASE("bad input: a missing program is rejected", "[e2e]") {
  MarkerScope marker;
  TempDir started;
  auto r = run(drunCommand({"--nproc-per-node", "2"}, {marker.env()}));
  expectUsageError(r, {"program", "script", "command"}, started, marker);
}

TEST_CASE("bad input: a program that does not exist is rejected", "[e2e]") {
  MarkerScope marker;
  TempDir started;
  SECTION("absolute path") {
    auto missing = (started / "no-such-dir" / "no_such_program").string();
    auto r = run(drunCommand({"--nproc-per-node", "2", missing}, {marker.env()}));
    expectUsageError(r, {missing, "no_such_program"}, started, marker);
  }
  SECTION("name looked up in PATH") {
    auto r = run(drunCommand({"--nproc-per-node", "2", "drun_e2e_no_such_program_" + randomHex(6)},
                             {marker.env()}));
    expectUsageError(r, {"drun_e2e_no_such_program_"}, started, marker);
  }
  SECTION("missing .py script") {
    auto missing = (started / "absent.py").string();
    auto r = run(drunCommand({missing}, {marker.env()}));
    expectUsageError(r, {"absent.py"}, started, marker);
  }
}

TEST_CASE("bad input: a program that is not executable is rejected", "[e2e]") {
  MarkerScope marker;
  TempDir started;
  TempDir scripts;
  auto script = scripts.write("not_executable.sh", "#!/bin/sh\ntouch " +
                                                       (started / "ran").string() + "\n");
  auto r = run(drunCommand({"--nproc-per-node", "2", script.string()}, {marker.env()}));
  expectUsageError(r, {"not_executable.sh", "executable", "permission"}, started, marker);
  SECTION("a directory is not a program either") {
    auto r2 = run(drunCommand({scripts.path().string()}, {marker.env()}));
    expectUsageError(r2, {scripts.path().string(), "executable", "directory"}, started, marker);
  }
}

TEST_CASE("bad input: a malformed --local-ranks-filter is rejected", "[e2e]") {
  for (std::string bad : {"abc", "0,x", "0;1", "1.5", "0,,1", "-1"}) {
    DYNAMIC_SECTION("--local-ranks-filter '" << bad << "'") {
      MarkerScope marker;
      TempDir started;
      auto r = run(drunCommand(
          concat({"--nproc-per-node", "2", "--local-ranks-filter", bad}, touchProgram(started)),
          {marker.env()}));
      expectUsageError(r, {"local-ranks-filter", "local_ranks_filter", "filter", bad}, started,
                       marker);
    }
  }
}

TEST_CASE("bad input: a malformed --nnodes is rejected", "[e2e]") {
  for (std::string bad : {"abc", "1:x", "3:2", "0", "-1", ":", "1:2:3"}) {
    DYNAMIC_SECTION("--nnodes '" << bad << "'") {
      MarkerScope marker;
      TempDir started;
      auto r = run(drunCommand(concat({"--nnodes", bad, "--standalone"}, touchProgram(started)),
                               {marker.env()}));
      expectUsageError(r, {"nnodes", bad}, started, marker);
    }
  }
}

TEST_CASE("bad input: --run-path is rejected with a clear message", "[e2e]") {
  MarkerScope marker;
  TempDir started;
  SECTION("dash spelling") {
    auto r = run(drunCommand(concat({"--run-path"}, touchProgram(started)), {marker.env()}));
    expectUsageError(r, {"run-path", "run_path"}, started, marker);
  }
  SECTION("underscore spelling") {
    auto r = run(drunCommand(concat({"--run_path"}, touchProgram(started)), {marker.env()}));
    expectUsageError(r, {"run-path", "run_path"}, started, marker);
  }
}

TEST_CASE("accepted options: --standalone --nnodes 1 --monitor-interval -v --role", "[e2e]") {
  MarkerScope marker;
  auto r = run(drunCommand({"--standalone", "--nnodes", "1", "--monitor-interval", "0.5", "-v",
                            "--role", "trainer", "--nproc-per-node", "2", envDump()},
                           {marker.env()}));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  auto dumps = parseEnvDumps(r.out);
  REQUIRE(dumps.count(0) == 1);
  REQUIRE(dumps.count(1) == 1);
  CHECK(dumps[0].get("ROLE_NAME") == "trainer");
  CHECK(dumps[1].get("ROLE_NAME") == "trainer");
  SECTION("--nnodes 1:1") {
    auto r2 = run(drunCommand({"--standalone", "--nnodes", "1:1", envDump()}, {marker.env()}));
    INFO(r2.describe());
    CHECK(r2.status() == 0);
  }
}

TEST_CASE("dash and underscore spellings are both accepted", "[e2e]") {
  MarkerScope marker;
  TempDir logs;
  auto spelled = [&](const std::string& sep) {
    auto opt = [&](std::string name) {
      std::replace(name.begin(), name.end(), '-', sep[0]);
      return "--" + name;
    };
    return concat({opt("nproc-per-node"), "3", opt("max-restarts"), "0", opt("monitor-interval"),
                   "1", opt("shutdown-timeout"), "5", opt("local-ranks-filter"), "0,2",
                   opt("log-dir"), (logs / ("d" + sep)).string(), opt("no-python"), envDump()},
                  {});
  };
  for (std::string sep : {"-", "_"}) {
    DYNAMIC_SECTION("separator '" << sep << "'") {
      auto r = run(drunCommand(spelled(sep), {marker.env()}));
      INFO(r.describe());
      REQUIRE(r.status() == 0);
      auto dumps = parseEnvDumps(r.out);
      CHECK(dumps.size() == 2);  // the filter let ranks 0 and 2 through
      CHECK(dumps.count(0) == 1);
      CHECK(dumps.count(2) == 1);
      CHECK(dumps[0].get("WORLD_SIZE") == "3");
      CHECK(dumps[0].get("TORCHELASTIC_MAX_RESTARTS") == "0");
      CHECK(fs::is_directory(logs / ("d" + sep)));
      CHECK_FALSE(fs::is_empty(logs / ("d" + sep)));
    }
  }
}

TEST_CASE("PET_* variables set options and the command line wins", "[e2e]") {
  MarkerScope marker;
  SECTION("PET_NPROC_PER_NODE alone") {
    auto r = run(drunCommand({envDump()}, {marker.env(), "PET_NPROC_PER_NODE=3"}));
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    auto dumps = parseEnvDumps(r.out);
    CHECK(dumps.size() == 3);
    CHECK(dumps[0].get("WORLD_SIZE") == "3");
  }
  SECTION("--nproc-per-node beats PET_NPROC_PER_NODE") {
    auto r = run(drunCommand({"--nproc-per-node", "2", envDump()},
                             {marker.env(), "PET_NPROC_PER_NODE=3"}));
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    auto dumps = parseEnvDumps(r.out);
    CHECK(dumps.size() == 2);
    CHECK(dumps[0].get("WORLD_SIZE") == "2");
  }
  SECTION("PET_MAX_RESTARTS, and --max-restarts beats it") {
    auto r = run(drunCommand({envDump()}, {marker.env(), "PET_MAX_RESTARTS=2"}));
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    CHECK(parseEnvDumps(r.out)[-1].get("TORCHELASTIC_MAX_RESTARTS") == "2");
    auto r2 = run(drunCommand({"--max-restarts", "1", envDump()},
                              {marker.env(), "PET_MAX_RESTARTS=2"}));
    INFO(r2.describe());
    REQUIRE(r2.status() == 0);
    CHECK(parseEnvDumps(r2.out)[-1].get("TORCHELASTIC_MAX_RESTARTS") == "1");
  }
  SECTION("PET_ROLE") {
    auto r = run(drunCommand({envDump()}, {marker.env(), "PET_ROLE=reader"}));
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    CHECK(parseEnvDumps(r.out)[-1].get("ROLE_NAME") == "reader");
  }
}

TEST_CASE("nproc-per-node cpu and auto start one worker per CPU", "[e2e]") {
  MarkerScope marker;
  std::set<size_t> acceptable = {cpuCountOnline(), cpuCountAffinity()};
  for (std::string spelling : {"cpu", "auto"}) {
    DYNAMIC_SECTION("--nproc-per-node " << spelling) {
      auto r = run(drunCommand({"--nproc-per-node", spelling, envDump()}, {marker.env()}));
      INFO(r.describe());
      REQUIRE(r.status() == 0);
      auto dumps = parseEnvDumps(r.out);
      auto world = dumps.begin()->second.get("WORLD_SIZE");
      REQUIRE(world);
      CHECK(acceptable.count(std::stoul(*world)) == 1);
    }
  }
}

// ============================================================================================
// The environment each worker sees
// ============================================================================================

TEST_CASE("each worker sees the torchrun environment with ranks 0..N-1 exactly once", "[e2e]") {
  MarkerScope marker;
  const int n = 4;
  auto r = run(drunCommand({"--standalone", "--nproc-per-node", std::to_string(n), envDump()},
                           {marker.env()}));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  auto dumps = parseEnvDumps(r.out);
  REQUIRE(dumps.size() == static_cast<size_t>(n));
  std::set<std::string> ranks, errorFiles, ports, runIds, tokens;
  for (auto& [consoleRank, d] : dumps) {
    INFO("console rank " << consoleRank);
    for (auto key : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                     "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR",
                     "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                     "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_ERROR_FILE",
                     "TORCHELASTIC_USE_AGENT_STORE", "DRUN_JOB_TOKEN", "OMP_NUM_THREADS"}) {
      INFO(key);
      CHECK(d.count(key) == 1);
    }
    auto rank = d.get("RANK").value_or("?");
    CHECK(rank == std::to_string(consoleRank));  // the console prefix is the global rank
    ranks.insert(rank);
    CHECK(d.get("LOCAL_RANK") == rank);
    CHECK(d.get("ROLE_RANK") == rank);
    CHECK(d.get("WORLD_SIZE") == std::to_string(n));
    CHECK(d.get("LOCAL_WORLD_SIZE") == std::to_string(n));
    CHECK(d.get("ROLE_WORLD_SIZE") == std::to_string(n));
    CHECK(d.get("GROUP_RANK") == "0");
    CHECK(d.get("GROUP_WORLD_SIZE") == "1");
    CHECK(d.get("ROLE_NAME") == "default");
    CHECK(d.get("MASTER_ADDR") == "127.0.0.1");
    CHECK(d.get("TORCHELASTIC_RESTART_COUNT") == "0");
    CHECK(d.get("TORCHELASTIC_MAX_RESTARTS") == "0");
    CHECK(d.get("TORCHELASTIC_USE_AGENT_STORE") == "False");
    CHECK(d.get("E2E_MARKER") == marker.env().substr(std::string("E2E_MARKER=").size()));
    auto port = d.get("MASTER_PORT").value_or("");
    REQUIRE_FALSE(port.empty());
    CHECK(std::stol(port) > 0);
    CHECK(std::stol(port) < 65536);
    ports.insert(port);
    runIds.insert(d.get("TORCHELASTIC_RUN_ID").value_or(""));
    tokens.insert(d.get("DRUN_JOB_TOKEN").value_or(""));
    auto errorFile = d.get("TORCHELASTIC_ERROR_FILE").value_or("");
    CHECK_FALSE(errorFile.empty());
    CHECK(fs::path(errorFile).is_absolute());
    errorFiles.insert(errorFile);
  }
  CHECK(ranks == std::set<std::string>{"0", "1", "2", "3"});
  CHECK(ports.size() == 1);
  CHECK(runIds.size() == 1);
  CHECK_FALSE(runIds.begin()->empty());
  CHECK(tokens.size() == 1);
  CHECK_FALSE(tokens.begin()->empty());
  CHECK(errorFiles.size() == static_cast<size_t>(n));  // unique per rank
}

TEST_CASE("OMP_NUM_THREADS: cores / nproc (at least 1), a note for Python when unset, kept when set",
          "[e2e]") {
  MarkerScope marker;
  std::set<size_t> cores = {cpuCountOnline(), cpuCountAffinity()};
  for (int n : {1, 2, 4}) {
    DYNAMIC_SECTION("unset, nproc " << n) {
      auto r = run(drunCommand({"--nproc-per-node", std::to_string(n), envDump()},
                               {marker.env(), "OMP_NUM_THREADS"}));
      INFO(r.describe());
      REQUIRE(r.status() == 0);
      std::set<std::string> expected;
      for (size_t c : cores) expected.insert(std::to_string(std::max<size_t>(1, c / n)));
      for (auto& [rank, d] : parseEnvDumps(r.out)) {
        INFO("rank " << rank);
        CHECK(expected.count(d.get("OMP_NUM_THREADS").value_or("unset")) == 1);
      }
      // No note for a program that is not Python (issue 19: it matters where OpenMP does).
      CHECK_FALSE(contains(r.err, "OMP_NUM_THREADS"));
    }
  }
  SECTION("unset, a Python program: one note on drun's own stderr") {
    TempDir dir;
    auto script = dir.write("omp.py", "import os\nprint(os.environ['OMP_NUM_THREADS'])\n");
    auto r = run(drunCommand({"--nproc-per-node", "2", script.string()},
                             {marker.env(), "OMP_NUM_THREADS"}));
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    size_t notes = 0;
    for (auto& l : parseConsole(r.err)) notes += l.rank < 0 && contains(l.text, "OMP_NUM_THREADS");
    CHECK(notes == 1);
  }
  SECTION("set by the user: passed through unchanged, no note") {
    auto r = run(drunCommand({"--nproc-per-node", "2", envDump()},
                             {marker.env(), "OMP_NUM_THREADS=7"}));
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    for (auto& [rank, d] : parseEnvDumps(r.out)) CHECK(d.get("OMP_NUM_THREADS") == "7");
    CHECK_FALSE(contains(r.err, "OMP_NUM_THREADS"));
  }
}

TEST_CASE("${local_rank} in the program's arguments is substituted per worker", "[e2e]") {
  MarkerScope marker;
  auto r = run(drunCommand({"--nproc-per-node", "3", envDump(), "--out=/tmp/x${local_rank}.log",
                            "${local_rank}", "plain", "${rank}"},
                           {marker.env()}));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  auto dumps = parseEnvDumps(r.out);
  REQUIRE(dumps.size() == 3);
  for (auto& [rank, d] : dumps) {
    std::string lr = std::to_string(rank);
    CHECK(d.args == std::vector<std::string>{"--out=/tmp/x" + lr + ".log", lr, "plain", "${rank}"});
  }
}

TEST_CASE("any program can bind MASTER_PORT even without SO_REUSEADDR", "[e2e]") {
  MarkerScope marker;
  // Rank 0 binds, in two rounds (a restart): the port is free for it each time. Rank 1 fails the
  // first round only once rank 0 has bound.
  TempDir marks;
  const std::string bound0 = (marks.path() / "bound0").string();
  auto r = run(drunCommand({"--nproc-per-node", "2", "--max-restarts", "1", behave(),
                            "bind-master@rank=0", "touch:" + bound0 + "@rank=0", "await:" + bound0 + "@rank=1",
                            "exit:1@restart=0"},
                           {marker.env()}));
  INFO(r.describe());
  CHECK(r.status() == 0);
  int bound = 0;
  for (const auto& l : parseConsole(r.out)) bound += l.text.rfind("BOUND ", 0) == 0;
  CHECK(bound == 2);
}

TEST_CASE("two concurrent jobs get different MASTER_PORTs", "[e2e]") {
  MarkerScope marker;
  TempDir dir;
  std::vector<fs::path> fifos = {dir / "gate0", dir / "gate1"};
  for (auto& f : fifos) REQUIRE(::mkfifo(f.c_str(), 0600) == 0);
  std::vector<std::unique_ptr<Process>> jobs;
  for (auto& f : fifos)
    jobs.push_back(std::make_unique<Process>(drunCommand(
        {"--standalone", "--nproc-per-node", "2", behave(), "env:MASTER_PORT", "gate:" + f.string()},
        {marker.env()})));
  // Both jobs are running at once: every worker of both is inside its gate.
  for (auto& job : jobs) CHECK(job->waitForLines("READY", 2, 20s));
  for (auto& f : fifos) {
    int fd = ::open(f.c_str(), O_WRONLY | O_NONBLOCK);
    CHECK(fd >= 0);
    if (fd >= 0) ::close(fd);
  }
  std::vector<std::string> ports;
  for (auto& job : jobs) {
    auto r = job->wait();
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    std::set<std::string> seen;
    for (auto& l : parseConsole(r.out))
      if (l.text.rfind("MASTER_PORT=", 0) == 0) seen.insert(l.text.substr(12));
    REQUIRE(seen.size() == 1);
    ports.push_back(*seen.begin());
  }
  CHECK(ports[0] != ports[1]);
}

// ============================================================================================
// Programs: executables, scripts, python
// ============================================================================================

TEST_CASE("hostname as the worker program", "[e2e]") {
  MarkerScope marker;
  auto r = run(drunCommand({"--standalone", "--nproc-per-node", "2", "hostname"}, {marker.env()}));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  auto by = linesByRank(r.out);
  CHECK(by[0] == std::vector<std::string>{hostName()});
  CHECK(by[1] == std::vector<std::string>{hostName()});
  CHECK(by.size() == 2);
}

TEST_CASE("a shell script as the worker program", "[e2e]") {
  MarkerScope marker;
  TempDir dir;
  auto script = dir.write("worker.sh",
                          "#!/bin/sh\necho \"rank $RANK of $WORLD_SIZE args $*\"\necho \"to-stderr "
                          "$LOCAL_RANK\" >&2\n",
                          fs::perms::owner_all);
  auto r = run(drunCommand({"--nproc-per-node", "3", script.string(), "a", "b"}, {marker.env()}));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  auto out = linesByRank(r.out);
  auto err = linesByRank(r.err);
  for (int rank = 0; rank < 3; ++rank) {
    CHECK(out[rank] == std::vector<std::string>{"rank " + std::to_string(rank) + " of 3 args a b"});
    CHECK(hasLine(err[rank], "to-stderr " + std::to_string(rank)));
  }
}

TEST_CASE("a .py program runs under python with PYTHONUNBUFFERED=1", "[e2e]") {
  MarkerScope marker;
  TempDir dir;
  auto script = dir.write("train.py",
                          "import os, sys\n"
                          "print('py rank', os.environ['RANK'], 'unbuffered',\n"
                          "      os.environ.get('PYTHONUNBUFFERED'), 'args', sys.argv[1:])\n");
  SECTION("ranks and arguments") {
    auto r = run(drunCommand({"--nproc-per-node", "2", script.string(), "--lr", "0.1"},
                             {marker.env()}));
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    auto by = linesByRank(r.out);
    for (int rank = 0; rank < 2; ++rank)
      CHECK(by[rank] == std::vector<std::string>{"py rank " + std::to_string(rank) +
                                                 " unbuffered 1 args ['--lr', '0.1']"});
  }
  SECTION("a PYTHONUNBUFFERED the user set is kept") {
    auto r = run(drunCommand({script.string()}, {marker.env(), "PYTHONUNBUFFERED=x"}));
    INFO(r.describe());
    REQUIRE(r.status() == 0);
    CHECK(contains(r.out, "unbuffered x"));
  }
}

TEST_CASE("python output reaches the console while the worker runs (python -u semantics)",
          "[e2e]") {
  MarkerScope marker;
  TempDir dir;
  auto script = dir.write("slow.py",
                          "import time\nprint('READY from python', flush=False)\ntime.sleep(60)\n");
  Process job(drunCommand({"--nproc-per-node", "2", script.string()}, {marker.env()}));
  bool seen = job.waitForLines("READY from python", 2, 20s);
  job.signal(SIGTERM);
  auto r = job.wait(20s);
  INFO(r.describe());
  CHECK(seen);
  CHECK(r.status() == 143);
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("python module (-m) runs python -m with the arguments", "[e2e]") {
  MarkerScope marker;
  TempDir dir;
  dir.write("e2e_mod.py", "import os, sys\nprint('module rank', os.environ['RANK'], sys.argv[1:])\n");
  auto options = drunCommand({"--nproc-per-node", "2", "-m", "e2e_mod", "x", "y"},
                             {marker.env(), "PYTHONPATH=" + dir.path().string()});
  auto r = run(options);
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  auto by = linesByRank(r.out);
  CHECK(by[0] == std::vector<std::string>{"module rank 0 ['x', 'y']"});
  CHECK(by[1] == std::vector<std::string>{"module rank 1 ['x', 'y']"});
  SECTION("--module spelling, run from the module's directory") {
    auto o2 = drunCommand({"--module", "e2e_mod"}, {marker.env()});
    o2.cwd = dir.path();
    auto r2 = run(o2);
    INFO(r2.describe());
    CHECK(r2.status() == 0);
    CHECK(contains(r2.out, "module rank 0 []"));
  }
}

TEST_CASE("PYTHON_EXEC and DRUN_PYTHON choose the interpreter", "[e2e]") {
  MarkerScope marker;
  TempDir dir;
  auto fake = dir.write("fakepython", "#!/bin/sh\necho \"fake-python $*\"\n", fs::perms::owner_all);
  auto script = dir.write("train.py", "print('real python')\n");
  for (std::string var : {"PYTHON_EXEC", "DRUN_PYTHON"}) {
    DYNAMIC_SECTION(var) {
      auto r = run(drunCommand({script.string(), "arg1"}, {marker.env(), var + "=" + fake.string()}));
      INFO(r.describe());
      REQUIRE(r.status() == 0);
      CHECK(contains(r.out, "fake-python"));
      CHECK(contains(r.out, script.string() + " arg1"));
      CHECK_FALSE(contains(r.out, "real python"));
    }
  }
}

TEST_CASE("no-python execs the program as given even a .py", "[e2e]") {
  MarkerScope marker;
  TempDir dir;
  auto script = dir.write("tool.py", "#!/bin/sh\necho \"shell ran $RANK\"\n", fs::perms::owner_all);
  auto r = run(drunCommand({"--no-python", "--nproc-per-node", "2", script.string()},
                           {marker.env()}));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  auto by = linesByRank(r.out);
  CHECK(by[0] == std::vector<std::string>{"shell ran 0"});
  CHECK(by[1] == std::vector<std::string>{"shell ran 1"});
}

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
  CHECK(r.wall < 2500ms);
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
// Signals and leftovers
// ============================================================================================

namespace {
// A 2-worker job whose workers each started a setsid'd grandchild (ignoring TERM/INT/HUP) and
// then sleep; returns once all are up (and the /proc scan sees them: drun, 2 workers, 2
// grandchildren at least).
std::unique_ptr<Process> startStubbornJob(const MarkerScope& marker,
                                          std::vector<std::string> extraArgs = {}) {
  auto args = concat({"--nproc-per-node", "2"}, extraArgs);
  args = concat(args, {behave(), "grandchild:stubborn", "ready", "sleep:60000"});
  auto job = std::make_unique<Process>(drunCommand(args, {marker.env()}));
  REQUIRE(job->waitForLines("READY", 2, 20s));
  auto pids = processesWithEnv(marker.env());
  INFO(MarkerScope::describe(pids));
  REQUIRE(pids.size() >= 5);
  return job;
}
}  // namespace

TEST_CASE("SIGTERM to drun: exit 143 and no process left (setsid grandchildren included)", "[e2e]") {
  MarkerScope marker;
  auto job = startStubbornJob(marker);
  auto [r, took] = signalAndWait(*job, SIGTERM);
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 143);
  CHECK(took < 5s);  // the workers die of SIGTERM: no grace period needed
  auto left = marker.leftovers(5s);
  INFO("left behind:\n" << MarkerScope::describe(left));
  CHECK(left.empty());
}

TEST_CASE("SIGINT SIGHUP SIGQUIT to drun: exit 128+signal and nothing left", "[e2e]") {
  for (int sig : {SIGINT, SIGHUP, SIGQUIT}) {
    DYNAMIC_SECTION("signal " << sig) {
      MarkerScope marker;
      Process job(drunCommand({"--nproc-per-node", "2", behave(), "ready", "sleep:60000"},
                              {marker.env()}));
      REQUIRE(job.waitForLines("READY", 2, 20s));
      job.signal(sig);
      auto r = job.wait(20s);
      INFO(r.describe());
      REQUIRE_FALSE(r.timedOut);
      CHECK(r.status() == 128 + sig);
      auto left = marker.leftovers(5s);
      INFO("left behind:\n" << MarkerScope::describe(left));
      CHECK(left.empty());
    }
  }
}

TEST_CASE("SIGKILL to drun: every worker and grandchild goes too", "[e2e]") {
  MarkerScope marker;
  auto job = startStubbornJob(marker);
  job->signal(SIGKILL);
  auto r = job->wait(10s);
  CHECK(r.signal == SIGKILL);
  auto left = marker.leftovers(10s);
  INFO("left behind:\n" << MarkerScope::describe(left));
  CHECK(left.empty());
}

TEST_CASE("a worker ignoring SIGTERM is SIGKILLed after --shutdown-timeout", "[e2e]") {
  MarkerScope marker;
  SECTION("on SIGTERM to drun") {
    Process job(drunCommand({"--shutdown-timeout", "1", "--nproc-per-node", "2", behave(),
                             "ignore:TERM", "ready", "sleep:60000"},
                            {marker.env()}));
    REQUIRE(job.waitForLines("READY", 2, 20s));
    auto [r, took] = signalAndWait(job, SIGTERM);
    INFO(r.describe());
    REQUIRE_FALSE(r.timedOut);
    CHECK(r.status() == 143);
    CHECK(took >= 900ms);  // the grace period was honoured...
    CHECK(took < 6s);      // ...and not much more
    auto left = marker.leftovers(5s);
    INFO("left behind:\n" << MarkerScope::describe(left));
    CHECK(left.empty());
  }
  SECTION("when another worker fails") {
    // Rank 1 fails only once rank 0 ignores SIGTERM.
    TempDir dir;
    auto ignoring = (dir / "ignoring").string();
    auto r = run(drunCommand({"--shutdown_timeout", "1", "--nproc-per-node", "2", behave(),
                              "ignore:TERM@rank=0", "touch:" + ignoring + "@rank=0",
                              "await:" + ignoring + "@rank=1", "exit:6@rank=1", "sleep:60000"},
                             {marker.env()}));
    INFO(r.describe());
    REQUIRE_FALSE(r.timedOut);
    CHECK(r.status() == 6);
    expectRootCause(r, rootCause(1, "exited with code 6"));
    CHECK(r.wall >= 900ms);
    CHECK(r.wall < 6s);
    CHECK(marker.leftovers(5s).empty());
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
// A console nobody reads; malformed error files
// ============================================================================================

namespace {

// Runs a 2-worker drun whose workers print forever, its stdout (with `bothStreams` its stderr
// too) on a FIFO the test holds open and never reads: a reader that stopped reading. Once the
// pipe is full (drun's console is then stuck in write(2)), SIGTERMs drun and checks that it
// exits with 143 within a hang guard and leaves no process behind.
void expectSigtermEndsDrunWithAStuckConsole(bool bothStreams) {
  MarkerScope marker;
  TempDir dir;
  auto fifo = dir / "console";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // Both ends, so that drun's open for writing does not wait for a reader.
  struct Held {
    int fd;
    ~Held() { ::close(fd); }
  } held{::open(fifo.c_str(), O_RDWR | O_CLOEXEC)};
  REQUIRE(held.fd >= 0);
  auto options = drunCommand({"--nproc-per-node", "2", "--shutdown-timeout", "1", "yes",
                              "a line of worker output that nobody reads"},
                             {marker.env()}, 60s);
  std::string redirect = "> '" + fifo.string() + "'" + (bothStreams ? " 2>&1" : "");
  options.argv.insert(options.argv.begin(), {"/bin/sh", "-c", "exec \"$0\" \"$@\" " + redirect});
  Process job(options);
  // Lines do not pack the pipe's pages exactly: "full" is three quarters of its capacity.
  int full = ::fcntl(held.fd, F_GETPIPE_SZ) * 3 / 4;
  REQUIRE(full > 0);
  auto deadline = std::chrono::steady_clock::now() + 20s;
  int queued = 0;
  while ((::ioctl(held.fd, FIONREAD, &queued) != 0 || queued < full) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);  // another process's progress: look again
  REQUIRE(queued >= full);

  auto [r, took] = signalAndWait(job, SIGTERM);
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 143);
  // Grace (1 s) + the console's drain deadline (1 s) + slack: a hang guard, not a benchmark.
  CHECK(took < 10s);
  auto left = marker.leftovers(5s);
  INFO("left behind:\n" << MarkerScope::describe(left));
  CHECK(left.empty());
}

}  // namespace

TEST_CASE("a stdout nobody reads does not keep drun alive after SIGTERM", "[e2e]") {
  expectSigtermEndsDrunWithAStuckConsole(false);
}

// Hidden until the agent writes its own messages ("drun: received SIGTERM ...") through the
// ConsoleWriter: today they are blocking fprintf(stderr)s, stuck when stderr is that pipe too.
TEST_CASE("stdout and stderr on one pipe nobody reads: SIGTERM still ends drun",
          "[e2e][console-wiring]") {
  expectSigtermEndsDrunWithAStuckConsole(true);
}

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

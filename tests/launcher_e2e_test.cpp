// End-to-end tests of the single-node launcher: build/bin/drun run as a user runs it, with the
// helper workers in build/tests/helpers (env_dump, behave, line_writer). Each scenario is its own
// TEST_CASE so CTest runs them in parallel. Every drun run carries a unique marker variable
// (MarkerScope), which drun passes on to its workers: the tests use it to prove that nothing
// outlives drun, and to sweep up after a broken drun.
//
// The CLI contract tested here is the one in the launcher's task description (torchrun spellings,
// PET_* variables, exit codes, summary lines, "drun: error:" for bad input with exit code 2).
//
// This file: argument parsing and bad input. The others: launcher_worker_e2e_test.cpp (the
// environment each worker sees, the programs it runs), launcher_output_e2e_test.cpp,
// launcher_exit_e2e_test.cpp (exit codes, the failure summary, restarts),
// launcher_signals_e2e_test.cpp (signals, leftovers, a console nobody reads).
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

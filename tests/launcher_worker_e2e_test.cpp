// End-to-end tests of the single-node launcher: the environment each worker sees and the
// programs it runs (executables, scripts, python).
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
      // No note for a program that is not Python (the note matters where OpenMP does).
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

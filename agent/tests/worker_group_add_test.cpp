// WorkerGroup::add: an in-process recovery's replacement joins the running group with the same
// ranks, its output takes the rank's place (prefix, log files appended), the others run on.
#include <signal.h>

#include <catch2/catch.hpp>
#include <stdexcept>

#include "drun/agent/worker_group.hpp"
#include "test_support.hpp"

using namespace drun::agent;
using namespace drun::agent::test;

TEST_CASE_METHOD(CapturedConsole, "a worker added for a dead rank runs beside the others, with its ranks and log files",
                 "[agent]") {
  TempDir dir;
  options.output.prefixTemplate = "[${rank}]:";
  options.output.attemptDir = dir.path();
  WorkerGroup group(io, options);
  std::vector<WorkerExit> exits;
  group.onExit([&](const WorkerExit& e) { exits.push_back(e); });
  group.start({shellWorker(0, "exec sleep 30", 10), shellWorker(1, "echo first; exit 3", 11)});
  const pid_t survivor = group.pids()[0];
  REQUIRE(runUntil(io, [&] { return exits.size() == 1; }));
  CHECK(exits[0].localRank == 1);

  CHECK_THROWS_AS(group.add(shellWorker(0, "exit 0", 10)), std::logic_error);  // rank 0 still runs
  const pid_t added = group.add(shellWorker(1, "echo second; exit 0", 11));
  CHECK(added != exits[0].pid);
  REQUIRE(runUntil(io, [&] { return exits.size() == 2; }));
  CHECK(exits[1].localRank == 1);
  CHECK(exits[1].globalRank == 11);
  CHECK(exits[1].pid == added);
  CHECK(exits[1].succeeded());
  CHECK(group.running() == 1);  // rank 0, in the process it started in
  CHECK(::kill(survivor, 0) == 0);
  CHECK(group.pids().size() == 3);

  bool stopped = false;
  group.stop(SIGKILL, std::chrono::milliseconds(0), [&] { stopped = true; });
  REQUIRE(runUntil(io, [&] { return stopped; }));
  REQUIRE(runUntil(io, [&] { return out.text().find("[11]:second") != std::string::npos; }));
  CHECK(out.text().find("[11]:first") != std::string::npos);
  CHECK(readLogFile(dir.path() / "1" / "stdout.log") == "first\nsecond\n");  // appended, not truncated
}

TEST_CASE_METHOD(CapturedConsole, "a worker is not added to a group that stops or has not started", "[agent]") {
  WorkerGroup group(io, options);
  CHECK_THROWS_AS(group.add(shellWorker(0, "exit 0")), std::logic_error);
  group.start({shellWorker(0, "exit 3")});
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  bool stopped = false;
  group.stop(SIGTERM, std::chrono::milliseconds(0), [&] { stopped = true; });
  CHECK_THROWS_AS(group.add(shellWorker(0, "exit 0")), std::logic_error);
  REQUIRE(runUntil(io, [&] { return stopped; }));
}

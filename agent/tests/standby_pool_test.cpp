// Standby workers (standby_pool.hpp, WorkerGroup's standbys): a standby started beside the
// workers becomes a dead rank's worker (its exit, prefix and log files the rank's) and reads its
// assignment from its FIFO once it is ready (one not reading its FIFO is not taken, unless a spare
// asks: its assignment then waits in the FIFO); one that
// ends unassigned is reported apart; stop() waits for the standbys and the pool's stop() ends
// them; the assignment line is the difference of the two environments.
#include <signal.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "drun/agent/worker_group.hpp"
#include "standby_pool.hpp"
#include "test_support.hpp"

using namespace drun::agent;
using namespace drun::agent::test;
using drun::agent::detail::StandbyPool;

namespace {

// Assigns `replacement` once a standby is ready (it opened its FIFO), within a hang bound.
std::optional<pid_t> assignWhenReady(boost::asio::io_context& io, StandbyPool& pool, const WorkerSpec& replacement) {
  std::optional<pid_t> pid;
  runUntil(io, [&] { return (pid = pool.assign(replacement)).has_value(); });
  return pid;
}

// A standby that says it waits, then prints the line its FIFO gives it and ends.
WorkerSpec shellStandby(const std::string& script = "") {
  return shellWorker(0, script.empty() ? "echo standing by; read -r line < \"$DRUN_STANDBY\"; echo \"got $line\""
                                       : script);
}

}  // namespace

TEST_CASE_METHOD(CapturedConsole, "a standby becomes a dead rank's worker: its exit, prefix, log file and "
                 "assignment", "[agent]") {
  TempDir dir;
  options.output.prefixTemplate = "[${rank}]:";
  options.output.attemptDir = dir.path();
  WorkerGroup group(io, options);
  std::vector<WorkerExit> exits;
  std::vector<int> standbyExits;
  group.onExit([&](const WorkerExit& e) { exits.push_back(e); });
  group.onStandbyExit([&](int slot, const WorkerExit&) { standbyExits.push_back(slot); });
  group.start({shellWorker(0, "exec sleep 30", 10), shellWorker(1, "echo first; exit 3", 11)});
  StandbyPool pool(group, {1, dir.path()}, shellStandby());
  const auto started = pool.fill();
  REQUIRE(started.size() == 1);
  CHECK(started[0].slot == 0);
  CHECK(group.standbyPids() == std::vector<pid_t>{started[0].pid});
  CHECK(pool.fill().empty());  // one is enough
  REQUIRE(runUntil(io, [&] { return exits.size() == 1; }));
  CHECK(group.running() == 1);  // the standby is no worker
  REQUIRE(runUntil(io, [&] { return out.text().find("[standby 0]:standing by") != std::string::npos; }));

  WorkerSpec replacement = shellWorker(1, "unused", 11);
  replacement.env.push_back("RANK=11");
  const auto pid = assignWhenReady(io, pool, replacement);
  REQUIRE(pid);
  CHECK(*pid == started[0].pid);
  CHECK(group.standbyPids().empty());
  CHECK(group.running() == 2);
  REQUIRE(runUntil(io, [&] { return exits.size() == 2; }));
  CHECK(exits[1].pid == *pid);
  CHECK(exits[1].localRank == 1);
  CHECK(exits[1].globalRank == 11);
  CHECK(exits[1].succeeded());
  CHECK(standbyExits.empty());
  const std::string assigned = R"(got {"env":{"RANK":"11"},"unset":["DRUN_STANDBY"]})";
  REQUIRE(runUntil(io, [&] { return out.text().find("[11]:" + assigned) != std::string::npos; }));
  // Rank 1's log file goes on with the standby's lines from its assignment on.
  CHECK(readLogFile(dir.path() / "1" / "stdout.log") == "first\n" + assigned + "\n");
  CHECK(pool.assign(replacement) == std::nullopt);  // none left

  // A new standby in its place; stop() waits for it too.
  REQUIRE(pool.fill().size() == 1);
  bool stopped = false;
  group.stop(SIGKILL, std::chrono::milliseconds(0), [&] { stopped = true; });
  REQUIRE(runUntil(io, [&] { return stopped; }));
  CHECK(standbyExits == std::vector<int>{1});
  CHECK(group.standbyPids().empty());
}

TEST_CASE_METHOD(CapturedConsole, "a standby that ends unassigned is reported apart, a stopped pool ends its "
                 "standbys and starts none", "[agent]") {
  TempDir dir;
  WorkerGroup group(io, options);
  std::vector<std::pair<int, WorkerExit>> standbyExits;
  size_t workerExits = 0;
  group.onExit([&](const WorkerExit&) { ++workerExits; });
  group.onStandbyExit([&](int slot, const WorkerExit& e) { standbyExits.emplace_back(slot, e); });
  CHECK_THROWS_AS(group.startStandby(0, shellStandby()), std::logic_error);  // not started
  group.start({shellWorker(0, "exec sleep 30")});
  StandbyPool pool(group, {1, dir.path()}, shellStandby("exit 7"));
  REQUIRE(pool.fill().size() == 1);
  REQUIRE(runUntil(io, [&] { return standbyExits.size() == 1; }));
  CHECK(standbyExits[0].first == 0);
  CHECK(standbyExits[0].second.exitCode == 7);
  CHECK(workerExits == 0);
  CHECK(group.running() == 1);
  pool.exited(0);
  CHECK(pool.assign(shellWorker(0, "unused")) == std::nullopt);

  bool stopped = false;
  group.stop(SIGKILL, std::chrono::milliseconds(0), [&] { stopped = true; });
  REQUIRE(runUntil(io, [&] { return stopped; }));

  // Slots are the group's: another pool, another group.
  WorkerGroup second(io, options);
  second.onStandbyExit([&](int slot, const WorkerExit& e) { standbyExits.emplace_back(slot, e); });
  second.start({shellWorker(0, "exec sleep 30")});
  StandbyPool waiting(second, {2, dir.path()}, shellStandby("exec sleep 30"));
  REQUIRE(waiting.fill().size() == 2);
  // Not ready (neither opened its FIFO): not taken, still standbys.
  runUntil(io, [] { return false; }, std::chrono::milliseconds(300));
  CHECK(waiting.assign(shellWorker(0, "unused")) == std::nullopt);
  CHECK(second.standbyPids().size() == 2);
  waiting.stop();
  CHECK(waiting.stopped());
  REQUIRE(runUntil(io, [&] { return standbyExits.size() == 3; }));
  CHECK(standbyExits[1].second.signal == SIGKILL);
  CHECK(standbyExits[2].second.signal == SIGKILL);
  CHECK(waiting.fill().empty());
  CHECK(waiting.assign(shellWorker(0, "unused")) == std::nullopt);
  CHECK(second.running() == 1);
  stopped = false;
  second.stop(SIGKILL, std::chrono::milliseconds(0), [&] { stopped = true; });
  REQUIRE(runUntil(io, [&] { return stopped; }));
}

TEST_CASE_METHOD(CapturedConsole, "a standby assigned the --stdin rank reads drun's stdin, one assigned another "
                 "rank reads EOF", "[agent]") {
  TempDir dir;
  int input[2];
  REQUIRE(::pipe2(input, O_CLOEXEC) == 0);
  options.output.stdinRank = 11;
  options.output.stdinFd = input[0];
  options.output.prefixTemplate = "${rank}|";
  WorkerGroup group(io, options);
  std::vector<WorkerExit> exits;
  group.onExit([&](const WorkerExit& e) { exits.push_back(e); });
  group.start({shellWorker(0, "exit 3", 10), shellWorker(1, "exit 3", 11)});
  StandbyPool pool(group, {2, dir.path()}, shellStandby("read -r line < \"$DRUN_STANDBY\"; "
                                                        "while read l; do echo \"got:$l\"; done; echo eof"));
  REQUIRE(pool.fill().size() == 2);
  REQUIRE(runUntil(io, [&] { return exits.size() == 2; }));
  REQUIRE(assignWhenReady(io, pool, shellWorker(0, "unused", 10)));
  REQUIRE(runUntil(io, [&] { return exits.size() == 3; }));  // rank 10: EOF at once
  REQUIRE(assignWhenReady(io, pool, shellWorker(1, "unused", 11)));
  REQUIRE(::write(input[1], "hello\n", 6) == 6);
  ::close(input[1]);
  REQUIRE(runUntil(io, [&] { return exits.size() == 4; }));
  ::close(input[0]);
  auto lines = splitLines(out.waitAll());
  CHECK(std::count(lines.begin(), lines.end(), "10|eof") == 1);
  CHECK(std::count(lines.begin(), lines.end(), "11|got:hello") == 1);
  CHECK(std::count(lines.begin(), lines.end(), "11|eof") == 1);
}

TEST_CASE_METHOD(CapturedConsole, "a standby still starting is taken only when asked (a spare taking a place): its "
                 "assignment waits in its FIFO until it reads it", "[agent]") {
  TempDir dir;
  options.output.prefixTemplate = "[${rank}]:";
  WorkerGroup group(io, options);
  std::vector<WorkerExit> exits;
  group.onExit([&](const WorkerExit& e) { exits.push_back(e); });
  group.onStandbyExit([](int, const WorkerExit&) {});
  group.start({});  // a spare's group: no worker before its place
  // Starts for 0.5 s (its imports) before it opens its FIFO.
  StandbyPool pool(group, {1, dir.path()}, shellStandby("sleep 0.5; read -r line < \"$DRUN_STANDBY\"; echo \"got $line\""));
  const auto started = pool.fill();
  REQUIRE(started.size() == 1);
  WorkerSpec rank = shellWorker(1, "unused", 3);
  rank.env.push_back("RANK=3");
  CHECK(pool.assign(rank) == std::nullopt);  // not ready
  const auto pid = pool.assign(rank, StandbyPool::Taking::Starting);
  REQUIRE(pid);
  CHECK(*pid == started[0].pid);
  CHECK(group.standbyPids().empty());
  CHECK(group.running() == 1);
  REQUIRE(runUntil(io, [&] { return exits.size() == 1; }));
  CHECK(exits[0].pid == *pid);
  CHECK(exits[0].globalRank == 3);
  CHECK(exits[0].succeeded());
  CHECK(pool.assign(rank, StandbyPool::Taking::Starting) == std::nullopt);  // none left
  // The console writer's queue drained first: the line may still be in it at the exit.
  CHECK_THAT(out.waitAll(), Catch::Contains(R"([3]:got {"env":{"RANK":"3"},"unset":["DRUN_STANDBY"]})"));
}

TEST_CASE("a standby's assignment: the variables the rank has otherwise or in addition, and those it lacks",
          "[agent]") {
  WorkerSpec standby, rank;
  standby.env = {"A=1", "B=2", "DRUN_STANDBY=/x/standby_0", "SAME=s"};
  rank.env = {"A=1", "B=3", "RANK=4", "SAME=s", "EMPTY="};
  const std::string line = detail::standbyAssignment(standby, rank);
  REQUIRE(line.back() == '\n');
  CHECK(line.find('\n') == line.size() - 1);  // one line
  const auto message = nlohmann::json::parse(line);
  CHECK(message["env"] == nlohmann::json({{"B", "3"}, {"RANK", "4"}, {"EMPTY", ""}}));
  CHECK(message["unset"] == nlohmann::json::array({"DRUN_STANDBY"}));
}

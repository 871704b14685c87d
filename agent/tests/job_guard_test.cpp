// JobGuard: the token, the sweep (groups and marker), the watchdog surviving drun's SIGKILL,
// being replaced when killed, and being reaped.
#include "drun/agent/job_guard.hpp"

#include <signal.h>
#include <sys/wait.h>

#include <cctype>

#include "../src/child_reaper.hpp"
#include "drun/agent/worker_group.hpp"
#include "test_support.hpp"

using namespace drun::agent;
using namespace drun::agent::test;

namespace {

// Waits (bounded) until no live process carries `marker`, seen twice in a row (a process caught
// inside execve shows no environment for a moment); returns those still left.
std::vector<pid_t> waitUntilNoneMarked(const std::string& marker) {
  std::vector<pid_t> left;
  eventually([&] {
    // Killed descendants re-parented to this (subreaper) process are our zombies: collect them.
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    left = processesWithEnvEntry(marker);
    if (!left.empty()) return false;
    std::this_thread::sleep_for(5ms);
    left = processesWithEnvEntry(marker);
    return left.empty();
  });
  return left;
}

}  // namespace

TEST_CASE("the job token is 128 random bits in hex", "[agent]") {
  auto a = JobGuard::start();
  auto b = JobGuard::start();
  CHECK(a.token().size() == 32);
  CHECK(std::all_of(a.token().begin(), a.token().end(),
                    [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); }));
  CHECK(a.token() != b.token());
  CHECK(a.envEntry() == "DRUN_JOB_TOKEN=" + a.token());
  CHECK(a.watchdogPid() > 0);
  CHECK(a.watchdogPid() != b.watchdogPid());
}

TEST_CASE("descendants that left the group do not outlive a SIGKILLed drun", "[agent]") {
  // The setsid'd sleep leaves the worker's process group (and session): only the marker finds
  // it. The plain one stays in the group.
  StandInDrun drun(shellWorker(0, "setsid sleep 60 & sleep 60 & echo ready; wait"), true);
  auto lines = drun.readLinesUntil("ready");
  REQUIRE(lines.size() == 2);
  REQUIRE(lines[0].rfind("token ", 0) == 0);
  std::string marker = "DRUN_JOB_TOKEN=" + lines[0].substr(6);
  // The worker and both sleeps carry the marker (the setsid one possibly still forking).
  CHECK(eventually([&] { return processesWithEnvEntry(marker).size() >= 3; }));

  drun.kill();
  CHECK(waitUntilNoneMarked(marker).empty());
}

TEST_CASE_METHOD(CapturedConsole, "sweep() kills registered groups and marked processes now",
                 "[agent]") {
  auto guard = JobGuard::start();
  options.jobGuard = &guard;
  WorkerGroup group(io, options);
  int signalled = 0;
  group.onExit([&](const WorkerExit& e) { signalled += e.signal == SIGKILL; });
  bool ready = false;
  out.onLine([&](const std::string& line) { ready = ready || line == "ready"; });
  group.start({shellWorker(0, "setsid sleep 60 & echo ready; wait")});

  // A process without the marker, only known by its registered group.
  pid_t unmarked = ::fork();
  REQUIRE(unmarked >= 0);
  if (unmarked == 0) {
    ::setpgid(0, 0);
    char* argv[] = {const_cast<char*>("sleep"), const_cast<char*>("60"), nullptr};
    char* envp[] = {nullptr};
    ::execve("/bin/sleep", argv, envp);
    ::_exit(127);
  }
  ::setpgid(unmarked, unmarked);
  guard.addProcessGroup(unmarked);
  REQUIRE(runUntil(io, [&] { return ready; }));
  CHECK(eventually([&] { return processesWithEnvEntry(guard.envEntry()).size() >= 2; }));

  guard.sweep();
  CHECK(detail::waitForExit(unmarked, 5s));
  int status = 0;
  CHECK(::waitpid(unmarked, &status, 0) == unmarked);
  CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  CHECK(signalled == 1);
  CHECK(waitUntilNoneMarked(guard.envEntry()).empty());
  CHECK(guard.watchdogPid() > 0);  // still guarding
  CHECK(::kill(guard.watchdogPid(), 0) == 0);
}

TEST_CASE_METHOD(CapturedConsole,
                 "the watchdog ignores terminal signals, is replaced when killed, never a worker",
                 "[agent]") {
  auto guard = JobGuard::start();
  options.jobGuard = &guard;
  WorkerGroup group(io, options);
  std::vector<WorkerExit> exits;
  group.onExit([&](const WorkerExit& e) { exits.push_back(e); });
  bool ready = false;
  out.onLine([&](const std::string& line) { ready = ready || line == "ready"; });
  group.start({shellWorker(0, "echo ready; exec sleep 60")});
  REQUIRE(runUntil(io, [&] { return ready; }));

  pid_t first = guard.watchdogPid();
  CHECK(::getpgid(first) == first);  // its own group: Ctrl-C to drun's group misses it
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE}) ::kill(first, sig);
  CHECK_FALSE(detail::waitForExit(first, 100ms));  // a short look: it must still be there

  ::kill(first, SIGKILL);
  REQUIRE(detail::waitForExit(first, 5s));
  // Its death goes through the group's SIGCHLD handling: no report, the worker still runs.
  REQUIRE(runUntil(io, [&] { return !std::filesystem::exists("/proc/" + std::to_string(first)); }));
  CHECK(exits.empty());
  CHECK(group.running() == 1);

  // The next message notices and starts a new watchdog, which still guards the worker.
  guard.removeProcessGroup(group.pids()[0]);
  guard.addProcessGroup(group.pids()[0]);
  pid_t second = guard.watchdogPid();
  CHECK(second > 0);
  CHECK(second != first);
  CHECK(::kill(second, 0) == 0);
  guard.sweep();
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  REQUIRE(exits.size() == 1);
  CHECK(exits[0].signal == SIGKILL);
}

TEST_CASE("destroying the guard makes the watchdog sweep, exit and be reaped", "[agent]") {
  pid_t watchdog = -1;
  pid_t marked = -1;
  std::string marker;
  {
    auto guard = JobGuard::start();
    watchdog = guard.watchdogPid();
    marker = guard.envEntry();
    marked = ::fork();
    REQUIRE(marked >= 0);
    if (marked == 0) {
      ::setpgid(0, 0);
      char* argv[] = {const_cast<char*>("sleep"), const_cast<char*>("60"), nullptr};
      char* envp[] = {const_cast<char*>(marker.c_str()), nullptr};
      ::execve("/bin/sleep", argv, envp);
      ::_exit(127);
    }
    // Wait until the exec happened (the marker shows in /proc) before letting the guard go.
    REQUIRE(eventually([&] { return processesWithEnvEntry(marker).size() == 1; }));
  }
  errno = 0;
  CHECK(::waitpid(watchdog, nullptr, WNOHANG) == -1);  // already reaped
  CHECK(errno == ECHILD);
  int status = 0;
  CHECK(::waitpid(marked, &status, 0) == marked);
  CHECK((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL));
}

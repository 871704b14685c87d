// End-to-end tests of the single-node launcher: signals to drun, what is left after it, and a
// console nobody reads.
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
// A console nobody reads
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

// IdleProbe (--hang-idle) judges the thread that runs the program: a process whose helper thread
// spins while its main thread sleeps is idle; one whose main thread spins is not. Real processes
// (python3, which /usr/bin has on every host the tests run on); deadlines are upper bounds.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "idle_probe.hpp"

extern char** environ;

using namespace drun::agent::detail;
using namespace std::chrono_literals;

namespace {

int64_t idleClockNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// python3 -c `code` in a process group of its own (as drun starts a worker); killed at scope end.
struct SpinningPython {
  pid_t pid = -1;
  explicit SpinningPython(const char* code) {
    posix_spawnattr_t attr;
    ::posix_spawnattr_init(&attr);
    ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    ::posix_spawnattr_setpgroup(&attr, 0);
    const char* argv[] = {"/usr/bin/python3", "-c", code, nullptr};
    if (::posix_spawn(&pid, argv[0], nullptr, &attr, const_cast<char**>(argv), environ) != 0) pid = -1;
    ::posix_spawnattr_destroy(&attr);
  }
  ~SpinningPython() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

// Whether the probe sees `group` change (busy) within 3 s of sampling, after a 1 s start.
bool seenBusy(pid_t group) {
  IdleProbe probe;
  std::this_thread::sleep_for(1s);  // python's start-up is busy
  probe.sample({group}, idleClockNs());
  const auto deadline = std::chrono::steady_clock::now() + 3s;
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
    if (probe.sample({group}, idleClockNs()).at(0) == 0) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("idle probe: a busy helper thread does not make a sleeping main thread busy", "[hangs]") {
  SpinningPython helperSpins(
      "import threading, time\n"
      "def spin():\n"
      "    while True: pass\n"
      "threading.Thread(target=spin, daemon=True).start()\n"
      "time.sleep(60)\n");
  REQUIRE(helperSpins.pid > 0);
  CHECK(!seenBusy(helperSpins.pid));

  SpinningPython mainSpins("while True: pass\n");
  REQUIRE(mainSpins.pid > 0);
  CHECK(seenBusy(mainSpins.pid));
}

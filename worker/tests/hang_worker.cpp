// A native worker for the hang tests and benchmark: beats `steps` times (one step every
// --step-ms, inside a section named --section), then behaves as --hang says on the rank given by
// --rank (RANK when omitted means every rank):
//   sleep    : nanosleep for ever (a rank stuck in a system call, no heartbeat)
//   spin     : a busy loop, no heartbeat
//   section  : goes on beating inside a section that never ends
//   none     : exits 0 after the steps
// Usage: hang_worker [--steps N] [--step-ms MS] [--section NAME] [--hang KIND] [--hang-rank R]
//                    [--hang-restart N (only when TORCHELASTIC_RESTART_COUNT == N; default 0)]
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "drun/worker.hpp"

namespace {

void sleepMs(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (::nanosleep(&ts, &ts) != 0) {
  }
}

__attribute__((noinline)) void stuckInSleep() {
  for (;;) ::pause();
}

__attribute__((noinline)) void stuckSpinning() {
  volatile unsigned long n = 0;
  for (;;) n = n + 1;
}

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 5, stepMs = 50, hangRank = -1, hangRestart = 0;
  std::string section = "step", hang = "none";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else if (a == "--step-ms") stepMs = std::atoi(argv[i + 1]);
    else if (a == "--section") section = argv[i + 1];
    else if (a == "--hang") hang = argv[i + 1];
    else if (a == "--hang-rank") hangRank = std::atoi(argv[i + 1]);
    else if (a == "--hang-restart") hangRestart = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "hang_worker: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const int rank = envInt("RANK", 0);
  const bool hangs = hang != "none" && (hangRank < 0 || hangRank == rank) &&
                     envInt("TORCHELASTIC_RESTART_COUNT", 0) == hangRestart;
  std::printf("rank %d channel %s\n", rank, drun::worker::enabled() ? "on" : "off");
  std::fflush(stdout);
  for (int s = 0; s < steps; ++s) {
    drun::worker::Section step(section.c_str());
    sleepMs(stepMs);
  }
  if (!hangs) return 0;
  std::printf("rank %d hangs (%s)\n", rank, hang.c_str());
  std::fflush(stdout);
  if (hang == "sleep") stuckInSleep();
  if (hang == "spin") stuckSpinning();
  if (hang == "section") {
    drun::worker::Section stuck(section.c_str());
    for (;;) {
      drun::worker::heartbeat();
      sleepMs(stepMs);
    }
  }
  return 0;
}

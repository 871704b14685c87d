// Measures WorkerGroup's spawn cost: start N workers of a program (default 4 x /bin/hostname)
// and wait until every one was reported (exited, pipes drained), `runs` times; prints
// min/median/max wall time. Output goes to /dev/null. With "guard", each run also starts a
// JobGuard first and destroys it last (watchdog fork, final sweep, reap), as drun does.
//   agent-spawn-bench [runs=50] [workers=4] [program=/bin/hostname] [guard]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "drun/agent/job_guard.hpp"
#include "drun/agent/worker_group.hpp"

int main(int argc, char** argv) {
  int runs = argc > 1 ? std::atoi(argv[1]) : 50;
  int count = argc > 2 ? std::atoi(argv[2]) : 4;
  const char* program = argc > 3 ? argv[3] : "/bin/hostname";
  bool withGuard = argc > 4 && std::string(argv[4]) == "guard";
  int devNull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  auto console = std::make_shared<drun::agent::ConsoleWriter>(
      drun::agent::ConsoleWriterOptions{devNull, devNull});
  std::vector<double> ms;
  for (int run = 0; run < runs; ++run) {
    auto t0 = std::chrono::steady_clock::now();
    std::optional<drun::agent::JobGuard> guard;
    if (withGuard) guard.emplace(drun::agent::JobGuard::start());
    boost::asio::io_context io;
    drun::agent::GroupOptions options;
    options.output.prefixTemplate = "[${rank}]:";
    options.output.console = console;
    options.jobGuard = guard ? &*guard : nullptr;
    auto group = std::make_unique<drun::agent::WorkerGroup>(io, options);
    int reported = 0;
    group->onExit([&](const drun::agent::WorkerExit&) { ++reported; });
    std::vector<drun::agent::WorkerSpec> specs;
    for (int i = 0; i < count; ++i)
      specs.push_back({i, i, {program}, {"PATH=/usr/bin:/bin", "RANK=" + std::to_string(i)}});
    group->start(specs);
    while (reported < count) io.run_one();
    group.reset();
    guard.reset();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("%s%d x %s, %d runs: min %.2f ms, median %.2f ms, max %.2f ms\n",
              withGuard ? "JobGuard + " : "", count, program, runs, ms.front(), ms[ms.size() / 2],
              ms.back());
  return 0;
}

// Hostile clients against a drun-rendezvous daemon: a client that never reads its large replies,
// alone, three times on one daemon: dropped each time, nothing kept (hostile_client_test.cpp says
// more).
#include <thread>

#include <catch2/catch.hpp>
#include <csignal>
#include <string>
#include <vector>

#include "drun/common/test_skip.hpp"
#include "hostile_clients.hpp"
#include "process.hpp"
#include "drun/store/tcp_store.hpp"

using namespace drun::test;
using namespace drun::test::hostile;
using namespace std::chrono_literals;

namespace {

constexpr int kSlowReaderRounds = 3;  // slow readers one after another, on one daemon

}  // namespace

TEST_CASE("hostile clients: a slow reader is dropped at each of three attacks and the daemon gives back its memory and fds",
          "[e2e][hostile]") {
  // Debug logging: the daemon says why it closed each connection (on stderr).
  Daemon daemon({"--log-level", "debug"});
  const pid_t pid = daemon.pid();
  {
    drun::rdzv::TcpStore store(storeOptions(daemon.port));
    store.set("hostile/big", std::string(kBigValueBytes, 'x'));
  }
  const long rss0 = vmRssKiB(pid), fds0 = openFds(pid);
  for (int round = 1; round <= kSlowReaderRounds; ++round) {
    INFO("slow reader " << round);
    const long rssBefore = vmRssKiB(pid), fdsBefore = openFds(pid);
    long peakRss = rssBefore;
    Raw raw(daemon.port, "127.0.0.1", 4096);
    REQUIRE(raw.connected());
    REQUIRE(raw.send(slowReaderRequests()));
    // Dropped for its output queue (64 MiB of the 100 MiB asked for), while it still reads nothing.
    bool dropped = false;
    const auto deadline = Clock::now() + 20s;
    while (!dropped && Clock::now() < deadline) {
      peakRss = std::max(peakRss, vmRssKiB(pid));
      dropped = daemon.process->waitForOutput(
          [&](const std::string&, const std::string& log) {
            return countOf(log, "closed (output queue over") >= static_cast<size_t>(round);
          },
          50ms);
    }
    CHECK(dropped);
    long fdsAfter = openFds(pid);
    for (const auto fdDeadline = Clock::now() + 10s; fdsAfter > fdsBefore && Clock::now() < fdDeadline;
         fdsAfter = openFds(pid))
      std::this_thread::sleep_for(20ms);
    const long rssAfter = vmRssKiB(pid);
    size_t drained = 0;
    const bool closed = raw.closedByPeer(15s, &drained);
    CHECK(closed);
    CHECK(drained < size_t(kBigGets) * kBigValueBytes);
    CHECK(fdsAfter <= fdsBefore);
    if (!kSanitizedBuild) {
      CHECK(peakRss < rss0 + 192 * 1024);
      CHECK(rssAfter < rss0 + 96 * 1024);  // the queue's cap plus slack, whatever the round
    }
    report("slow reader " + std::to_string(round) + " of " + std::to_string(kSlowReaderRounds),
           std::string(dropped ? "dropped (output queue over 64 MiB)" : "NOT dropped") + " after " +
               std::to_string(drained / 1024) + " KiB read; RSS KiB before/peak/after " +
               std::to_string(rssBefore) + " / " + std::to_string(peakRss) + " / " +
               std::to_string(rssAfter) + "; fds before/after " + std::to_string(fdsBefore) + " / " +
               std::to_string(fdsAfter));
  }
  CHECK(openFds(pid) <= fds0);
  drun::rdzv::TcpStore check(storeOptions(daemon.port));
  CHECK(check.get("hostile/big", 5s).size() == kBigValueBytes);  // still serving, big replies too
  daemon.process->signal(SIGTERM);
  CHECK(daemon.process->wait(10s).status() == 0);
}

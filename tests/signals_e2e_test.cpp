// End-to-end tests of signals: signals as people send them. A wrapper that signals
// drun twice at once (GNU timeout), a second Ctrl-C later, Ctrl-Z and `fg`, nohup, and
// --signals-to-handle. drun runs as a user runs it (build/bin/drun); every run carries a marker
// (MarkerScope) so that nothing it started can outlive the test.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <regex>
#include <thread>

#include "launcher_e2e.hpp"  // behave(), concat()
#include "process.hpp"

namespace fs = std::filesystem;
using namespace drun::test;
using namespace std::chrono_literals;

namespace {

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++n;
  return n;
}

// A /bin/sh worker that prints READY, then loops; on `signal` it takes `cleanupMs` to clean up,
// says "cleaned <rank>" and exits 0. The loop's `sleep` gets the group's signal too and dies.
std::vector<std::string> trappingWorker(const std::string& signal, int cleanupMs) {
  const std::string seconds = std::to_string(cleanupMs / 1000.0);
  return {"/bin/sh", "-c",
          "trap 'sleep " + seconds + "; echo cleaned $RANK; exit 0' " + signal +
              "; echo READY $RANK; while :; do sleep 0.05; done"};
}

// The state letter of /proc/<pid>/stat ('T' stopped, 'S' sleeping, ...); '?' when gone.
char processState(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return '?';
  auto close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
}

// Waits (deadline) until every pid's state is (`stopped`) or is not (!`stopped`) 'T'.
bool waitStates(const std::vector<pid_t>& pids, bool stopped, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    bool all = true;
    for (pid_t p : pids) all = all && ((processState(p) == 'T') == stopped);
    if (all) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(5ms);  // polling /proc: there is no event for a state change
  }
}

// The worker pids behave's "READY rank=<r> restart=<k> pid=<pid>" lines name.
std::vector<pid_t> readyPids(const std::string& out) {
  std::vector<pid_t> pids;
  static const std::regex ready(R"(READY rank=\d+ restart=\d+ pid=(\d+))");
  for (std::sregex_iterator it(out.begin(), out.end(), ready), end; it != end; ++it)
    pids.push_back(static_cast<pid_t>(std::stol((*it)[1])));
  return pids;
}

}  // namespace

TEST_CASE("signals: the same SIGTERM twice at once (GNU timeout) keeps the grace period", "[e2e]") {
  MarkerScope marker;
  Process job(drunCommand(concat({"--nproc-per-node", "2"}, trappingWorker("TERM", 300)),
                          {marker.env()}));
  REQUIRE(job.waitForLines("READY", 2, 20s));
  const auto first = std::chrono::steady_clock::now();
  job.signal(SIGTERM);
  // The first was taken and announced; the second comes well within the repeat window.
  REQUIRE(job.waitForOutput([](auto&, auto& err) { return contains(err, "received SIGTERM"); }, 10s));
  const bool withinWindow = std::chrono::steady_clock::now() - first < 250ms;
  job.signal(SIGTERM);
  auto r = job.wait(20s);
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 143);
  if (!withinWindow) {
    // A machine so loaded that the announcement took longer: the second may rightly escalate.
    WARN("the first SIGTERM was announced after more than 250 ms: not judged");
    return;
  }
  CHECK(count(r.out, "cleaned") == 2);  // both workers ran their handlers to the end
  CHECK_FALSE(contains(r.err, "killing the workers now"));
  CHECK(contains(r.err, "a second SIGTERM kills them now"));
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("signals: drun under GNU timeout: its SIGTERM to drun and to the group keeps the grace period", "[e2e]") {
  // GNU timeout itself: at its deadline it sends SIGTERM to drun and then to its own process
  // group, drun included: two within a millisecond (the kernel often merges them into one), so
  // this is judged whatever the machine's load; the test above takes two that drun saw apart.
  MarkerScope marker;
  RunOptions o = drunCommand(concat({"--nproc-per-node", "2"}, trappingWorker("TERM", 300)),
                             {marker.env()});
  o.argv.insert(o.argv.begin(), {"/usr/bin/timeout", "--preserve-status", "-s", "TERM", "6"});
  Process job(o);
  REQUIRE(job.waitForLines("READY", 2, 6s));
  auto r = job.wait(30s);
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 143);
  CHECK(contains(r.err, "received SIGTERM"));
  CHECK(count(r.out, "cleaned") == 2);  // both workers ran their handlers to the end
  CHECK_FALSE(contains(r.err, "killing the workers now"));
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("signals: a second SIGINT later than 0.5 s kills the workers at once and says so", "[e2e]") {
  MarkerScope marker;
  Process job(drunCommand({"--nproc-per-node", "2", "--shutdown-timeout", "60", behave(),
                           "ignore:INT", "ready", "sleep:60000"},
                          {marker.env()}));
  REQUIRE(job.waitForLines("READY", 2, 20s));
  job.signal(SIGINT);
  REQUIRE(job.waitForOutput([](auto&, auto& err) { return contains(err, "received SIGINT"); }, 10s));
  std::this_thread::sleep_for(700ms);  // the behaviour under test is the repeat window itself
  auto second = std::chrono::steady_clock::now();
  job.signal(SIGINT);
  auto r = job.wait(20s);
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 130);
  CHECK(std::chrono::steady_clock::now() - second < 10s);  // not the 60 s grace
  CHECK(contains(r.err, "second SIGINT: killing the workers now"));
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("signals: Ctrl-Z stops the workers with drun and fg continues them", "[e2e]") {
  MarkerScope marker;
  auto options = drunCommand({"--nproc-per-node", "2", behave(), "ready", "sleep:60000"},
                             {marker.env()});
  bool typed = false;
  SECTION("SIGTSTP sent to drun") {}
  SECTION("Ctrl-Z typed on drun's terminal") {
    options.stdoutTerminal = options.stderrTerminal = options.stdinTerminal = true;
    typed = true;
  }
  Process job(options);
  REQUIRE(job.waitForLines("READY", 2, 20s));
  std::vector<pid_t> workers;
  job.waitForOutput([&](auto& out, auto&) { return (workers = readyPids(out)).size() == 2; }, 5s);
  REQUIRE(workers.size() == 2);
  if (typed)
    job.writeStdin("\x1a");  // the terminal sends SIGTSTP to its foreground group: drun's
  else
    job.signal(SIGTSTP);
  CHECK(waitStates({job.pid()}, true, 10s));
  CHECK(waitStates(workers, true, 10s));
  job.signal(SIGCONT);  // what the shell's fg and bg send to drun's group
  CHECK(waitStates({job.pid()}, false, 10s));
  CHECK(waitStates(workers, false, 10s));
  job.signal(SIGTERM);
  auto r = job.wait(20s);
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 143);
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("signals: nohup drun survives SIGHUP (ignored at start stays ignored)", "[e2e]") {
  MarkerScope marker;
  TempDir dir;
  const std::string go = (dir / "go").string();
  auto options = drunCommand({"--nproc-per-node", "2", behave(), "ready", "await:" + go, "out:done"},
                             {marker.env()});
  options.argv.insert(options.argv.begin(), "/usr/bin/nohup");  // execs drun: the same pid
  Process job(options);
  REQUIRE(job.waitForLines("READY", 2, 20s));
  job.signal(SIGHUP);
  // The job then ends by itself: drun exits 0 only if SIGHUP did not end it.
  std::ofstream(go).put('\n');
  auto r = job.wait(20s);
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  CHECK(count(r.out, "done") == 2);
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("signals: --signals-to-handle SIGUSR1 is forwarded and ends the job like SIGTERM", "[e2e]") {
  MarkerScope marker;
  Process job(drunCommand(concat({"--nproc-per-node", "2", "--signals-to-handle", "SIGUSR1"},
                                 trappingWorker("USR1", 0)),
                          {marker.env()}));
  REQUIRE(job.waitForLines("READY", 2, 20s));
  job.signal(SIGUSR1);
  auto r = job.wait(20s);
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 128 + SIGUSR1);
  CHECK(count(r.out, "cleaned") == 2);
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("signals: --signals-to-handle rejects what is not a signal to end a job", "[e2e]") {
  for (const std::string bad : {"SIGKILL", "SIGTSTP", "SIGFOO", "USR1,"}) {
    auto r = run(drunCommand({"--signals-to-handle", bad, "/bin/true"}));
    INFO(r.describe());
    CHECK(r.status() == 2);
    CHECK(contains(r.err, "drun: error: --signals-to-handle"));
  }
  auto ok = run(drunCommand({"--signals_to_handle", "usr2,SIGUSR1,15", "/bin/true"}));
  INFO(ok.describe());
  CHECK(ok.status() == 0);
}

TEST_CASE("signals: under GNU timeout the workers get their grace period", "[e2e]") {
  // timeout signals drun, then its own process group (drun included): two SIGTERMs about 1 ms
  // apart; the second must not cut the grace period short (here the kernel merges the two pending
  // signals in most runs: the deterministic case is the first test above).
  MarkerScope marker;
  RunOptions options = drunCommand(concat({"--nproc-per-node", "2"}, trappingWorker("TERM", 300)),
                                   {marker.env()});
  options.argv.insert(options.argv.begin(), {"/usr/bin/timeout", "-s", "TERM", "2"});
  auto r = run(options);
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  REQUIRE(count(r.out, "READY") == 2);  // the workers were up when the time ran out
  CHECK(r.status() == 124);             // timeout's own status for "timed out"
  CHECK(count(r.out, "cleaned") == 2);
  CHECK_FALSE(contains(r.err, "killing the workers now"));
  CHECK(marker.leftovers(5s).empty());
}

// WorkerGroup: spawn, exit status, signals, stop/grace, drain bound, inherited process state.
#include "drun/agent/worker_group.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <map>

#include "../src/child_reaper.hpp"
#include "test_support.hpp"

using namespace drun::agent;
using namespace drun::agent::test;
using Clock = std::chrono::steady_clock;

namespace {

struct Collected {
  std::map<int, WorkerExit> byRank;
  std::vector<int> order;
  void attach(WorkerGroup& group) {
    group.onExit([this](const WorkerExit& e) {
      REQUIRE(byRank.count(e.localRank) == 0);  // once per worker
      byRank[e.localRank] = e;
      order.push_back(e.localRank);
    });
  }
};

}  // namespace

TEST_CASE_METHOD(CapturedConsole, "exit codes, ranks and pids are reported once per worker",
                 "[agent]") {
  WorkerGroup group(io, options);
  Collected got;
  got.attach(group);
  auto before = std::chrono::system_clock::now();
  group.start(
      {shellWorker(0, "exit 0", 10), shellWorker(1, "exit 3", 11), shellWorker(2, "exit 42", 12)});
  auto pids = group.pids();
  REQUIRE(pids.size() == 3);
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  REQUIRE(got.byRank.size() == 3);
  CHECK(got.byRank[0].succeeded());
  CHECK(got.byRank[1].exitCode == 3);
  CHECK(got.byRank[1].statusCode() == 3);
  CHECK(got.byRank[2].exitCode == 42);
  for (int r = 0; r < 3; ++r) {
    CHECK(got.byRank[r].signal == 0);
    CHECK(got.byRank[r].globalRank == 10 + r);
    CHECK(got.byRank[r].pid == pids[static_cast<size_t>(r)]);
    CHECK(got.byRank[r].when >= before);
  }
}

TEST_CASE_METHOD(CapturedConsole, "a signal death is reported as the signal and 128+signal",
                 "[agent]") {
  WorkerGroup group(io, options);
  Collected got;
  got.attach(group);
  group.start({shellWorker(0, "ulimit -c 0; kill -SEGV $$"), shellWorker(1, "kill -KILL $$")});
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  CHECK(got.byRank[0].signal == SIGSEGV);
  CHECK(got.byRank[0].statusCode() == 139);
  CHECK_FALSE(got.byRank[0].succeeded());
  CHECK(got.byRank[1].signal == SIGKILL);
  CHECK(got.byRank[1].statusCode() == 137);
}

TEST_CASE_METHOD(CapturedConsole,
                 "exec failures exit 127 (not found) or 126 (not executable) with the reason",
                 "[agent]") {
  WorkerGroup group(io, options);
  Collected got;
  got.attach(group);
  WorkerSpec missing{0, 0, {"/nonexistent/drun-test-program", "x"}, {}};
  WorkerSpec notInPath{1, 1, {"drun-no-such-program-in-path"}, {"PATH=/usr/bin:/bin"}};
  TempDir dir;
  std::string plainFile = dir.path() / "not-executable";
  { std::ofstream(plainFile) << "#!/bin/sh\nexit 0\n"; }
  std::filesystem::permissions(
      plainFile, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  WorkerSpec notExecutable{2, 2, {plainFile}, {}};
  WorkerSpec viaPath{3, 3, {"sh", "-c", "exit 7"}, {"PATH=/usr/bin:/bin"}};
  group.start({missing, notInPath, notExecutable, viaPath});
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  REQUIRE(got.byRank.size() == 4);
  CHECK(got.byRank[0].exitCode == 127);
  REQUIRE(got.byRank[0].stderrTail.size() == 1);
  CHECK_THAT(got.byRank[0].stderrTail.back(), Catch::Contains("/nonexistent/drun-test-program") &&
                                                  Catch::Contains("No such file or directory"));
  CHECK(got.byRank[1].exitCode == 127);
  REQUIRE(got.byRank[1].stderrTail.size() == 1);
  CHECK_THAT(got.byRank[1].stderrTail.back(), Catch::Contains("not found in PATH"));
  CHECK(got.byRank[2].exitCode == 126);
  REQUIRE(got.byRank[2].stderrTail.size() == 1);
  CHECK_THAT(got.byRank[2].stderrTail.back(), Catch::Contains("Permission denied"));
  CHECK(got.byRank[3].exitCode == 7);
  // The reason also reached the console, as the worker's own stderr would.
  CHECK_THAT(err.waitAll(),
             Catch::Contains("drun: cannot execute '/nonexistent/drun-test-program'"));
}

TEST_CASE_METHOD(
    CapturedConsole,
    "workers start clean: /dev/null stdin, own group, default signals, no inherited fds",
    "[agent]") {
  // Process state a worker must not inherit from drun.
  int leaked = ::dup(0);  // no O_CLOEXEC
  REQUIRE(leaked >= 3);
  struct sigaction ignore {
  }, oldUsr1{};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGUSR1, &ignore, &oldUsr1);
  sigset_t block, oldMask;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR2);
  ::pthread_sigmask(SIG_BLOCK, &block, &oldMask);

  options.output.prefixTemplate = "${local_rank}|";
  WorkerGroup group(io, options);
  Collected got;
  got.attach(group);
  group.start({
      shellWorker(0, "read x; echo stdin=$?"),
      shellWorker(1, "kill -USR1 $$; exit 0"),
      shellWorker(2, "echo ready; exec sleep 30"),
  });
  ::close(leaked);
  ::sigaction(SIGUSR1, &oldUsr1, nullptr);
  ::pthread_sigmask(SIG_SETMASK, &oldMask, nullptr);

  bool ready = false;
  out.onLine([&](const std::string& line) { ready = ready || line == "2|ready"; });
  REQUIRE(runUntil(io, [&] { return ready && got.byRank.size() == 2; }));
  pid_t sleeper = group.pids()[2];
  CHECK(::getpgid(sleeper) == sleeper);
  std::filesystem::path proc = "/proc/" + std::to_string(sleeper);
  // An inherited fd stays for good; the dynamic loader's own (ld.so.cache, libc) come and go
  // while `sleep` starts: look again until only 0-2 are left, within a bound.
  std::vector<std::string> fds;
  eventually([&] {
    fds.clear();
    for (const auto& entry : std::filesystem::directory_iterator(proc / "fd"))
      fds.push_back(entry.path().filename());
    std::sort(fds.begin(), fds.end());
    return fds.size() == 3;
  });
  CHECK(fds == std::vector<std::string>{"0", "1", "2"});
  CHECK(std::filesystem::read_symlink(proc / "fd" / "0") == "/dev/null");
  auto status = splitLines(readFile(proc / "status"));
  CHECK(std::count(status.begin(), status.end(), "SigBlk:\t0000000000000000") == 1);
  CHECK(std::count(status.begin(), status.end(), "SigIgn:\t0000000000000000") == 1);
  group.stop(SIGTERM, 5s, nullptr);
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));

  auto lines = splitLines(out.waitAll());
  CHECK(std::count(lines.begin(), lines.end(), "0|stdin=1") == 1);  // EOF at once
  CHECK(got.byRank[0].exitCode == 0);
  CHECK(got.byRank[1].signal == SIGUSR1);  // SIG_IGN was reset to SIG_DFL
  CHECK(got.byRank[2].signal == SIGTERM);
}

TEST_CASE_METHOD(CapturedConsole,
                 "stop() signals every worker's group and calls done after the last report",
                 "[agent]") {
  WorkerGroup group(io, options);
  Collected got;
  got.attach(group);
  group.start({shellWorker(0, "exec sleep 30"), shellWorker(1, "sleep 30; exit 0"),
               shellWorker(2, "exec sleep 30")});
  size_t reportsBeforeDone = 0;
  bool done = false;
  auto t0 = Clock::now();
  group.stop(SIGTERM, 10s, [&] {
    reportsBeforeDone = got.byRank.size();
    done = true;
  });
  REQUIRE(runUntil(io, [&] { return done; }));
  CHECK(Clock::now() - t0 < 5s);  // no wait for the grace period
  CHECK(reportsBeforeDone == 3);
  for (auto& [rank, exit] : got.byRank) CHECK(exit.signal == SIGTERM);

  // stop() with nothing left still completes (asynchronously).
  bool doneAgain = false;
  group.stop(SIGTERM, 1s, [&] { doneAgain = true; });
  CHECK_FALSE(doneAgain);
  REQUIRE(runUntil(io, [&] { return doneAgain; }));
}

TEST_CASE_METHOD(CapturedConsole,
                 "stop() SIGKILLs a worker that ignores SIGTERM once the grace period ends",
                 "[agent]") {
  WorkerGroup group(io, options);
  Collected got;
  got.attach(group);
  group.start({shellWorker(0, "trap '' TERM; echo ready; while true; do sleep 1; done")});
  bool ready = false;
  out.onLine([&](const std::string& line) { ready = ready || line == "ready"; });
  REQUIRE(runUntil(io, [&] { return ready; }));
  constexpr auto grace = 300ms;
  bool done = false;
  auto t0 = Clock::now();
  group.stop(SIGTERM, grace, [&] { done = true; });
  REQUIRE(runUntil(io, [&] { return done; }));
  auto elapsed = Clock::now() - t0;
  CHECK(got.byRank[0].signal == SIGKILL);
  CHECK(elapsed >= grace);
  CHECK(elapsed < 5s);
}

TEST_CASE_METHOD(CapturedConsole,
                 "a descendant holding the pipes delays the report by the drain bound only",
                 "[agent]") {
  options.pipeDrainBound = 150ms;
  auto group = std::make_unique<WorkerGroup>(io, options);
  Collected got;
  got.attach(*group);
  // The background sleep keeps stdout/stderr open after the shell exited.
  group->start({shellWorker(0, "sleep 30 & echo grandchild=$!; echo bye >&2; exit 4")});
  auto t0 = Clock::now();
  REQUIRE(runUntil(io, [&] { return group->running() == 0; }));
  CHECK(Clock::now() - t0 < 3s);
  CHECK(got.byRank[0].exitCode == 4);
  REQUIRE(!got.byRank[0].stderrTail.empty());
  CHECK(got.byRank[0].stderrTail.back() == "bye");

  pid_t grandchild = 0;
  out.onLine([&](const std::string& line) {
    if (line.rfind("grandchild=", 0) == 0) grandchild = std::stoi(line.substr(11));
  });
  REQUIRE(runUntil(io, [&] { return grandchild > 0; }));
  CHECK(::kill(grandchild, 0) == 0);  // still alive: the report did not wait for it
  group.reset();                      // SIGKILLs the worker's process group, the grandchild with it
  CHECK(detail::waitForExit(grandchild, 5s));
  ::waitpid(grandchild, nullptr, WNOHANG);  // ours only if this process is a subreaper
}

TEST_CASE_METHOD(CapturedConsole,
                 "stop() also ends a descendant holding the pipes of an exited worker", "[agent]") {
  options.pipeDrainBound = 10s;  // the report must come from the pipes closing
  WorkerGroup group(io, options);
  Collected got;
  got.attach(group);
  group.start({shellWorker(0, "sleep 30 & echo started; exit 0")});
  bool started = false;
  out.onLine([&](const std::string& line) { started = started || line == "started"; });
  REQUIRE(runUntil(io, [&] { return started; }));
  bool done = false;
  auto t0 = Clock::now();
  group.stop(SIGTERM, 10s, [&] { done = true; });
  REQUIRE(runUntil(io, [&] { return done; }));
  CHECK(Clock::now() - t0 < 5s);
  CHECK(got.byRank[0].exitCode == 0);
}

TEST_CASE_METHOD(CapturedConsole,
                 "the stderr tail keeps the last lines, the unterminated one included", "[agent]") {
  options.output.stderrTailLines = 5;
  WorkerGroup group(io, options);
  Collected got;
  got.attach(group);
  group.start({shellWorker(0,
                           "i=1; while [ $i -le 30 ]; do echo line$i >&2; i=$((i+1)); done;"
                           " echo to-stdout; printf last >&2; exit 1")});
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  std::deque<std::string> expected{"line27", "line28", "line29", "line30", "last"};
  CHECK(got.byRank[0].stderrTail == expected);
}

TEST_CASE_METHOD(CapturedConsole, "orphans re-parented to drun are reaped silently", "[agent]") {
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);  // as JobGuard::start() does
  WorkerGroup group(io, options);
  Collected got;
  got.attach(group);
  // The orphan's stdout goes to /dev/null so it does not hold the worker's pipe.
  group.start({shellWorker(0, "sh -c 'sleep 0.2' >/dev/null 2>&1 & echo orphan=$!; exit 0"),
               shellWorker(1, "exec sleep 30")});
  pid_t orphan = 0;
  out.onLine([&](const std::string& line) {
    if (line.rfind("orphan=", 0) == 0) orphan = std::stoi(line.substr(7));
  });
  REQUIRE(runUntil(io, [&] { return got.byRank.count(0) == 1 && orphan > 0; }));
  // Gone entirely (reaped, not a zombie) while the group keeps running; no report for it.
  REQUIRE(
      runUntil(io, [&] { return !std::filesystem::exists("/proc/" + std::to_string(orphan)); }));
  CHECK(got.byRank.size() == 1);
  CHECK(group.running() == 1);
}

TEST_CASE("a worker dies with its drun (parent-death signal)", "[agent]") {
  StandInDrun drun(shellWorker(0, "echo pid=$$; exec sleep 30"), false);  // no JobGuard
  auto lines = drun.readLinesUntil("pid=");
  REQUIRE(lines.size() == 1);
  pid_t worker = std::stoi(lines[0].substr(4));
  REQUIRE(worker > 0);
  drun.kill();
  CHECK(detail::waitForExit(worker, 5s));
  ::waitpid(worker, nullptr, WNOHANG);  // ours only if this process is a subreaper
}

TEST_CASE_METHOD(CapturedConsole, "start() of four /bin/hostname workers is quick", "[agent]") {
  options.output.prefixTemplate = "[${rank}]:";
  WorkerGroup group(io, options);
  Collected got;
  got.attach(group);
  std::vector<WorkerSpec> specs;
  for (int i = 0; i < 4; ++i) specs.push_back({i, i, {"/bin/hostname"}, {}});
  auto t0 = Clock::now();
  group.start(specs);
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  CHECK(Clock::now() - t0 < 2s);  // a hang guard; the spawn bench measures the real cost
  for (auto& [rank, exit] : got.byRank) CHECK(exit.succeeded());
  auto lines = splitLines(out.waitAll());
  REQUIRE(lines.size() == 4);
  for (const auto& line : lines) CHECK(line.size() > 4);
}

TEST_CASE_METHOD(CapturedConsole, "SIGCHLD restarts blocking calls elsewhere in drun", "[agent]") {
  WorkerGroup group(io, options);
  struct sigaction sa;
  REQUIRE(::sigaction(SIGCHLD, nullptr, &sa) == 0);
  CHECK(sa.sa_handler != SIG_DFL);
  CHECK((sa.sa_flags & SA_RESTART) != 0);
  CHECK((sa.sa_flags & SA_NOCLDSTOP) != 0);
}

TEST_CASE_METHOD(CapturedConsole, "an exception thrown by a callback never leaves the event loop",
                 "[agent]") {
  WorkerGroup group(io, options);
  int exits = 0;
  group.onExit([&](const WorkerExit&) {
    ++exits;
    throw std::runtime_error("a callback that throws");
  });
  group.start({shellWorker(0, "echo out; exit 0"), shellWorker(1, "echo err >&2; exit 3")});
  bool done = false;
  CHECK_NOTHROW(done = runUntil(io, [&] { return exits == 2; }));
  CHECK(done);
  CHECK(group.running() == 0);
}

TEST_CASE_METHOD(CapturedConsole,
                 "tty always: stdout and stderr are terminals of their own and lines stay clean",
                 "[agent]") {
  options.output.tty = TtyMode::Always;
  options.output.prefixTemplate = "${local_rank}|";
  WorkerGroup group(io, options);
  const std::string probe =
      "test -t 1 && echo out-tty; test -t 2 && echo err-tty >&2; test -t 0 || echo in-not-tty; "
      "printf 'a\\nb\\n'; readlink /proc/$$/fd/1 | cut -c1-9";
  group.start({shellWorker(0, probe), shellWorker(1, probe)});
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  auto text = out.waitAll();
  CHECK(text.find('\r') == std::string::npos);  // no ONLCR: "\n" stays "\n"
  auto lines = splitLines(text);
  for (std::string rank : {"0", "1"}) {
    for (std::string line : {"out-tty", "in-not-tty", "a", "b", "/dev/pts/"})
      CHECK(std::count(lines.begin(), lines.end(), rank + "|" + line) == 1);
  }
  auto errLines = splitLines(err.waitAll());
  CHECK(std::count(errLines.begin(), errLines.end(), "0|err-tty") == 1);
  CHECK(std::count(errLines.begin(), errLines.end(), "1|err-tty") == 1);
}

TEST_CASE_METHOD(CapturedConsole, "tty never and auto without a terminal: pipes", "[agent]") {
  auto mode = GENERATE(TtyMode::Never, TtyMode::Auto);  // the console here is a pipe
  options.output.tty = mode;
  WorkerGroup group(io, options);
  group.start({shellWorker(0, "test -t 1 || echo out-pipe; test -t 2 || echo err-pipe >&2")});
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  CHECK(out.waitAll() == "out-pipe\n");
  CHECK(err.waitAll() == "err-pipe\n");
}

TEST_CASE_METHOD(CapturedConsole, "stdin: the chosen rank reads drun's stdin to EOF, the others /dev/null",
                 "[agent]") {
  int input[2];
  REQUIRE(::pipe2(input, O_CLOEXEC) == 0);
  options.output.stdinRank = 11;  // a global rank
  options.output.stdinFd = input[0];
  options.output.prefixTemplate = "${rank}|";
  WorkerGroup group(io, options);
  const std::string echoInput = "while read l; do echo \"got:$l\"; done; echo eof";
  group.start({shellWorker(0, echoInput, 10), shellWorker(1, echoInput, 11)});
  bool sawFirst = false;
  out.onLine([&](const std::string& line) { sawFirst = sawFirst || line == "11|got:hello"; });
  REQUIRE(::write(input[1], "hello\n", 6) == 6);
  REQUIRE(runUntil(io, [&] { return sawFirst; }));  // forwarded while drun's stdin stays open
  REQUIRE(runUntil(io, [&] { return group.running() == 1; }));  // rank 10 read EOF at once
  REQUIRE(::write(input[1], "world\n", 6) == 6);
  ::close(input[1]);  // EOF on drun's stdin: the worker reads EOF
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  ::close(input[0]);
  auto lines = splitLines(out.waitAll());
  CHECK(lines.size() == 4);
  CHECK(std::count(lines.begin(), lines.end(), "10|eof") == 1);
  CHECK(std::count(lines.begin(), lines.end(), "11|got:hello") == 1);
  CHECK(std::count(lines.begin(), lines.end(), "11|got:world") == 1);
  CHECK(std::count(lines.begin(), lines.end(), "11|eof") == 1);
}

TEST_CASE_METHOD(CapturedConsole, "numa binding: a worker's CPUs and memory policy are set before exec",
                 "[agent][numa]") {
  cpu_set_t mine;
  REQUIRE(::sched_getaffinity(0, sizeof mine, &mine) == 0);
  int last = -1;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &mine)) last = cpu;
  REQUIRE(last >= 0);
  options.output.prefixTemplate = "${local_rank}|";
  WorkerGroup group(io, options);
  Collected got;
  got.attach(group);
  // The memory policy as get_mempolicy(2) reads it in the worker: "<mode> <node mask>".
  const std::string probe =
      "grep Cpus_allowed_list /proc/self/status | tr -d '\\t'; python3 -c 'import ctypes; "
      "l = ctypes.CDLL(None); m = ctypes.c_int(); n = ctypes.c_ulong(); "
      "l.syscall(" + std::to_string(SYS_get_mempolicy) + ", ctypes.byref(m), ctypes.byref(n), 64, 0, 0); "
      "print(\"policy\", m.value, n.value)'";
  WorkerSpec bound = shellWorker(0, probe);
  bound.binding = {{last}, {0}};
  WorkerSpec unbound = shellWorker(1, probe);
  WorkerSpec impossible = shellWorker(2, "exit 0");
  impossible.binding = {{CPU_SETSIZE * 4 - 1}, {}};  // no such CPU: the kernel refuses it
  group.start({bound, unbound, impossible});
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  auto lines = splitLines(out.waitAll());
  auto has = [&](const std::string& line) { return std::count(lines.begin(), lines.end(), line) == 1; };
  CHECK(has("0|Cpus_allowed_list:" + std::to_string(last)));
  CHECK(has("0|policy 2 1"));  // MPOL_BIND, node 0
  CHECK(has("1|policy 0 0"));  // MPOL_DEFAULT: drun's own
  if (CPU_COUNT(&mine) > 1) CHECK_FALSE(has("1|Cpus_allowed_list:" + std::to_string(last)));
  CHECK(got.byRank[1].succeeded());
  CHECK(got.byRank[2].exitCode == 126);
  REQUIRE_FALSE(got.byRank[2].stderrTail.empty());
  CHECK_THAT(got.byRank[2].stderrTail.back(), Catch::Contains("sched_setaffinity"));
}

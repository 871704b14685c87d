// OutputMux (through WorkerGroup): whole prefixed lines under concurrency, routing to files and
// console, filters, partial and over-long lines, no delay, a closed console.
#include "drun/agent/output_mux.hpp"

#include <signal.h>

#include <algorithm>
#include <boost/asio/steady_timer.hpp>
#include <map>
#include <set>

#include "drun/agent/worker_group.hpp"
#include "test_support.hpp"

using namespace drun::agent;
using namespace drun::agent::test;
using Clock = std::chrono::steady_clock;

namespace {

// Checks that `text` is only whole lines "[<rank>]:w<rank> <seq> <len> <len x letter>", with
// each rank's sequence numbers 0..count-1 in order. Returns the number of lines.
size_t checkWholeLines(const std::string& text, int ranks, int count) {
  std::map<int, int> nextSeq;
  size_t lines = 0, bad = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    REQUIRE(nl != std::string::npos);  // the output ends with a whole line
    std::string_view line(text.data() + pos, nl - pos);
    pos = nl + 1;
    ++lines;
    int rank = -1, lineRank = -1, seq = -1;
    long len = -1;
    int consumed = 0;
    std::string head(line.substr(0, 64));
    if (std::sscanf(head.c_str(), "[%d]:w%d %d %ld %n", &rank, &lineRank, &seq, &len, &consumed) !=
            4 ||
        rank != lineRank || rank < 0 || rank >= ranks) {
      ++bad;
      continue;
    }
    std::string_view payload = line.substr(static_cast<size_t>(consumed));
    char letter = static_cast<char>('a' + (rank + seq) % 26);
    bool whole = payload.size() == static_cast<size_t>(len) &&
                 payload.find_first_not_of(letter) == std::string_view::npos;
    bool inOrder = seq == nextSeq[rank];
    nextSeq[rank] = seq + 1;
    if (!whole || !inOrder) ++bad;
  }
  CHECK(bad == 0);
  for (int r = 0; r < ranks; ++r) CHECK(nextSeq[r] == count);
  return lines;
}

WorkerSpec lineWriter(int rank, int count, int minLen, int maxLen, const char* where) {
  WorkerSpec spec;
  spec.localRank = spec.globalRank = rank;
  spec.argv = {(helperDir() / "agent-line-writer").string(),
               std::to_string(rank),
               std::to_string(count),
               std::to_string(minLen),
               std::to_string(maxLen),
               where};
  return spec;
}

}  // namespace

TEST_CASE("prefix macros expand per worker", "[agent]") {
  OutputOptions options;
  options.roleName = "trainer";
  options.hostname = "nodeA";
  CHECK(expandPrefix("[${rank}]:", options, 1, 5) == "[5]:");
  CHECK(expandPrefix("${role_name}/${hostname}/${rank}/${local_rank}:", options, 1, 5) ==
        "trainer/nodeA/5/1:");
  CHECK(expandPrefix("${local_rank}${local_rank} ${unknown}", options, 3, 7) == "33 ${unknown}");
  CHECK(expandPrefix("", options, 3, 7).empty());
}

TEST_CASE("8 workers writing long lines at once: every line whole, prefixed, in order", "[agent]") {
  constexpr int kWorkers = 8, kLines = 60, kMin = 4 * 1024, kMax = 64 * 1024;
  bool nonBlocking = GENERATE(false, true);  // a non-blocking console exercises EAGAIN
  CAPTURE(nonBlocking);
  boost::asio::io_context io;
  ConsoleCapture out(io, nonBlocking), err(io, nonBlocking);
  GroupOptions options = consoleOptions(out, err);
  options.output.prefixTemplate = "[${rank}]:";
  WorkerGroup group(io, options);
  std::vector<WorkerSpec> specs;
  for (int r = 0; r < kWorkers; ++r) specs.push_back(lineWriter(r, kLines, kMin, kMax, "both"));
  int failures = 0;
  group.onExit([&](const WorkerExit& e) { failures += !e.succeeded(); });
  group.start(specs);
  REQUIRE(runUntil(
      io, [&] { return group.running() == 0; }, 60s));
  CHECK(failures == 0);
  CHECK(checkWholeLines(out.waitAll(), kWorkers, kLines) == kWorkers * kLines);
  CHECK(checkWholeLines(err.waitAll(), kWorkers, kLines) == kWorkers * kLines);
}

TEST_CASE_METHOD(CapturedConsole,
                 "routing: redirect, tee, console filter and files always get everything", "[agent]") {
  TempDir dir;
  options.output.prefixTemplate = "${local_rank}:";
  options.output.attemptDir = dir.path() / "attempt_0";
  options.output.routing[0] = StdRouting{3, 0};  // both streams to files only
  options.output.routing[1] = StdRouting{1, 0};  // stdout to file only, stderr to both
  options.output.routing[2] = StdRouting{0, 3};  // tee both
  // rank 3: default routing (none): console and files
  options.output.routing[5] = StdRouting{3, 1};  // both redirected, stdout tee'd: tee wins
  options.output.consoleLocalRanks = std::vector<int>{0, 1, 2, 3, 5};  // rank 4 filtered out
  WorkerGroup group(io, options);
  std::vector<WorkerSpec> specs;
  for (int r = 0; r < 6; ++r) {
    std::string n = std::to_string(r);
    specs.push_back(shellWorker(r, "echo out-" + n + "; echo err-" + n + " >&2"));
  }
  group.start(specs);
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  auto outLines = splitLines(out.waitAll());
  auto errLines = splitLines(err.waitAll());
  std::set<std::string> consoleOut(outLines.begin(), outLines.end());
  std::set<std::string> consoleErr(errLines.begin(), errLines.end());
  CHECK(consoleOut == std::set<std::string>{"2:out-2", "3:out-3", "5:out-5"});
  CHECK(consoleErr == std::set<std::string>{"1:err-1", "2:err-2", "3:err-3"});
  for (int r = 0; r < 6; ++r) {
    auto rankDir = dir.path() / "attempt_0" / std::to_string(r);
    CHECK(readLogFile(rankDir / "stdout.log") == "out-" + std::to_string(r) + "\n");  // raw, no prefix
    CHECK(readLogFile(rankDir / "stderr.log") == "err-" + std::to_string(r) + "\n");
  }
}

TEST_CASE_METHOD(CapturedConsole,
                 "duplicate filters: matching lines of every rank also go to filtered_*.log",
                 "[agent]") {
  TempDir dir;
  options.output.prefixTemplate = "[${rank}]:";
  options.output.attemptDir = dir.path();
  options.output.routing[1] = StdRouting{3, 0};  // files only: still filtered
  options.output.duplicateStdoutFilters = {"loss", "acc"};
  options.output.duplicateStderrFilters = {"Error"};
  WorkerGroup group(io, options);
  std::vector<WorkerSpec> specs;
  for (int r = 0; r < 2; ++r) {
    const std::string n = std::to_string(r);
    specs.push_back(shellWorker(r, "echo step " + n + "; echo loss=0." + n + "; echo 'Error: bad " + n +
                                       "' >&2; echo warn >&2; printf 'last acc " + n + "'"));
  }
  specs.push_back(shellWorker(2, "echo nothing; echo 'no error' >&2"));  // lower case: no match
  group.start(specs);
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  auto sorted = [](const std::string& text) {
    auto lines = splitLines(text);
    std::sort(lines.begin(), lines.end());
    return lines;
  };
  CHECK(sorted(readLogFile(dir.path() / "filtered_stdout.log")) ==
        std::vector<std::string>{"[0]:last acc 0", "[0]:loss=0.0", "[1]:last acc 1", "[1]:loss=0.1"});
  CHECK(sorted(readLogFile(dir.path() / "filtered_stderr.log")) ==
        std::vector<std::string>{"[0]:Error: bad 0", "[1]:Error: bad 1"});
  CHECK(readLogFile(dir.path() / "1" / "stdout.log") == "step 1\nloss=0.1\nlast acc 1");  // untouched
}

TEST_CASE_METHOD(CapturedConsole,
                 "without an attempt dir everything goes to the console, redirects ignored",
                 "[agent]") {
  options.output.defaultRouting = StdRouting{3, 0};
  WorkerGroup group(io, options);
  group.start({shellWorker(0, "echo hello; echo oops >&2")});
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  CHECK(out.waitAll() == "hello\n");
  CHECK(err.waitAll() == "oops\n");
}

TEST_CASE_METHOD(CapturedConsole,
                 "a partial last line gets its newline and over-long lines keep their bytes",
                 "[agent]") {
  TempDir dir;
  options.output.prefixTemplate = "[${rank}]:";
  options.output.attemptDir = dir.path();
  WorkerGroup group(io, options);
  constexpr size_t kLong = 2 * OutputMux::kMaxLineBytes + 1000;
  group.start({shellWorker(0, "printf abc"),
               shellWorker(1, "head -c " + std::to_string(kLong) +
                                  " /dev/zero | tr '\\0' x; echo; echo end")});
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  auto lines = splitLines(out.waitAll());
  std::vector<std::string> rank1;
  for (const auto& line : lines) {
    if (line.rfind("[0]:", 0) == 0) CHECK(line == "[0]:abc");
    if (line.rfind("[1]:", 0) == 0) rank1.push_back(line.substr(4));
  }
  CHECK(std::count(lines.begin(), lines.end(), "[0]:abc") == 1);
  // Passed on in kMaxLineBytes pieces of one open line: whole, unless rank 0's line came
  // between two pieces (then the rest continues on a fresh prefixed line). No byte is lost.
  REQUIRE(rank1.size() >= 2);
  REQUIRE(rank1.size() <= 3);
  CHECK(rank1.back() == "end");
  std::string joined;
  for (size_t i = 0; i + 1 < rank1.size(); ++i) joined += rank1[i];
  CHECK(joined.size() == kLong);
  CHECK(joined.find_first_not_of('x') == std::string::npos);
  CHECK(readLogFile(dir.path() / "0" / "stdout.log") == "abc");  // the file keeps the raw bytes
  CHECK(readLogFile(dir.path() / "1" / "stdout.log").size() == kLong + 5);
}

TEST_CASE_METHOD(CapturedConsole,
                 "a line reaches the console while the worker still runs (no delay)", "[agent]") {
  options.output.prefixTemplate = "[${rank}]:";
  WorkerGroup group(io, options);
  bool seen = false;
  out.onLine([&](const std::string& line) { seen = seen || line == "[0]:hello"; });
  group.start({shellWorker(0, "echo hello; exec sleep 30")});
  REQUIRE(runUntil(io, [&] { return seen; }));
  CHECK(group.running() == 1);
  group.stop(SIGKILL, 0ms, nullptr);
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
}

TEST_CASE("a closed console: its workers get SIGPIPE and the other console and files go on",
          "[agent]") {
  TempDir dir;
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  ::close(fds[0]);  // nobody reads drun's stdout any more (`drun ... | head` after head exited)
  boost::asio::io_context io;
  ConsoleCapture err(io);
  GroupOptions options = consoleOptions(fds[1], err.fd());
  err.feedBy(options.output.console);
  options.output.attemptDir = dir.path();
  options.output.routing[2] = StdRouting{1, 0};  // rank 2's stdout goes to its file only
  auto group = std::make_unique<WorkerGroup>(io, options);
  std::map<int, WorkerExit> exits;
  group->onExit([&](const WorkerExit& e) { exits[e.localRank] = e; });
  // Rank 0 writes until its pipe breaks (bounded: 100000 lines).
  group->start({shellWorker(0, "i=0; while [ $i -lt 100000 ]; do echo line $i; i=$((i+1)); done"),
                shellWorker(1, "echo still-here >&2"),
                lineWriter(2, 200, 100, 5000, "out")});
  REQUIRE(runUntil(io, [&] { return group->running() == 0; }));
  CHECK(exits[0].signal == SIGPIPE);  // as the writer of a broken shell pipeline
  CHECK(exits[1].succeeded());
  CHECK(exits[2].succeeded());
  CHECK(err.waitAll() == "still-here\n");  // stderr, a different console, still works
  CHECK(options.output.console->broken(ConsoleStream::Out));
  group.reset();
  options.output.console.reset();  // the writer goes before its fd
  ::close(fds[1]);
  auto file0 = readLogFile(dir.path() / "0" / "stdout.log");
  CHECK(std::count(file0.begin(), file0.end(), '\n') < 100000);
  auto file2 = readLogFile(dir.path() / "2" / "stdout.log");
  CHECK(std::count(file2.begin(), file2.end(), '\n') == 200);
}

TEST_CASE_METHOD(CapturedConsole,
                 "a partial line reaches the console while the worker waits and its rest follows",
                 "[agent]") {
  options.output.prefixTemplate = "[${rank}]:";
  // The captured console is a pipe: give it a terminal's delay (the next test keeps a pipe's).
  options.output.partialLinePipeDelay = options.output.partialLineDelay;
  WorkerGroup group(io, options);
  group.start({shellWorker(0, "printf Loading; sleep 1; echo ' done'")});
  auto start = Clock::now();
  // The worker sleeps 1 s after the partial line: it is on the console well before that.
  REQUIRE(runUntil(io, [&] { return out.text() == "[0]:Loading"; }, 5s));
  CHECK(Clock::now() - start < 900ms);
  CHECK(group.running() == 1);
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  CHECK(out.waitAll() == "[0]:Loading done\n");
}

TEST_CASE_METHOD(CapturedConsole,
                 "into a pipe a line stalled mid-write stays whole while another rank writes",
                 "[agent]") {
  // A loaded host stalls a writer between two write()s of one line; a console that is a pipe (a
  // reader parsing lines) waits partialLinePipeDelay (1 s) before it lets that line be cut.
  REQUIRE(options.output.partialLinePipeDelay >= std::chrono::milliseconds(1000));
  options.output.prefixTemplate = "[${rank}]:";
  WorkerGroup group(io, options);
  group.start({shellWorker(0, "printf Load; sleep 0.3; echo ing"),
               shellWorker(1, "sleep 0.1; echo other")});
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  CHECK(out.waitAll() == "[1]:other\n[0]:Loading\n");
}

TEST_CASE_METHOD(CapturedConsole,
                 "progress bars: each carriage-return segment is prefixed and keeps its return",
                 "[agent]") {
  options.output.prefixTemplate = "[${rank}]:";
  WorkerGroup group(io, options);
  group.start({shellWorker(0, "printf '10%%\\r20%%\\r100%%\\nline\\r\\n\\rend\\n'")});
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  // A lone '\r' after a line end is kept, before the next segment's prefix.
  CHECK(out.waitAll() == "[0]:10%\r[0]:20%\r[0]:100%\n[0]:line\r\n\r[0]:end\n");
}

TEST_CASE_METHOD(CapturedConsole,
                 "a partial line broken into by another rank: its rest gets a fresh prefix",
                 "[agent]") {
  TempDir dir;
  const std::string otherGo = (dir.path() / "other-go").string();
  const std::string restGo = (dir.path() / "rest-go").string();
  // Each waits (bounded: 20 s) for the test's go, so the order is the test's, not the clock's.
  auto waitFor = [](const std::string& path) {
    return "i=0; while [ ! -e " + path + " ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done; ";
  };
  options.output.prefixTemplate = "[${rank}]:";
  options.output.partialLinePipeDelay = options.output.partialLineDelay;  // as above
  WorkerGroup group(io, options);
  group.start({shellWorker(0, "printf Loading; " + waitFor(restGo) + "echo ' done'"),
               shellWorker(1, waitFor(otherGo) + "echo other")});
  REQUIRE(runUntil(io, [&] { return out.text() == "[0]:Loading"; }));
  std::ofstream{otherGo};
  REQUIRE(runUntil(io, [&] { return out.text() == "[0]:Loading\n[1]:other\n"; }));
  std::ofstream{restGo};
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  CHECK(out.waitAll() == "[0]:Loading\n[1]:other\n[0]: done\n");
}

namespace {

// A console whose stdout nobody reads (until the test says so) and whose stderr is captured.
struct StuckConsole {
  boost::asio::io_context io;
  int outFds[2] = {-1, -1};
  ConsoleCapture err{io};
  GroupOptions options;
  StuckConsole() {
    REQUIRE(::pipe2(outFds, O_CLOEXEC) == 0);
    ConsoleWriterOptions writer{outFds[1], err.fd()};
    writer.highWaterBytes = 64 * 1024;
    writer.lowWaterBytes = 16 * 1024;
    writer.drainOnDestroy = 200ms;
    options.output.console = std::make_shared<ConsoleWriter>(writer);
    err.feedBy(options.output.console);
  }
  ~StuckConsole() {
    options.output.console.reset();  // drains for at most 200 ms, then abandons: before the fds go
    ::close(outFds[0]);              // an abandoned console thread gets EPIPE and ends
    // outFds[1] stays open until exit: that thread may still be inside write(2) on it (closing it
    // under the thread is a race, and its number could go to the next open).
  }
  // Runs the loop for `span` with a 10 ms ticker; returns the longest gap between ticks.
  std::chrono::milliseconds tickFor(std::chrono::milliseconds span) {
    boost::asio::steady_timer ticker(io);
    auto last = std::chrono::steady_clock::now(), end = last + span;
    std::chrono::steady_clock::duration longest{0};
    std::function<void()> arm = [&] {
      ticker.expires_after(10ms);
      ticker.async_wait([&](const boost::system::error_code& ec) {
        if (ec) return;
        auto now = std::chrono::steady_clock::now();
        longest = std::max(longest, now - last);
        last = now;
        if (now < end) arm();
      });
    };
    arm();
    runUntil(io, [&] { return std::chrono::steady_clock::now() >= end; }, span + 5s);
    ticker.cancel();
    return std::chrono::duration_cast<std::chrono::milliseconds>(longest);
  }
};

}  // namespace

TEST_CASE_METHOD(StuckConsole, "a console nobody reads slows the workers, never the loop",
                 "[agent]") {
  constexpr int kLines = 200000;  // 2.2 MB: far more than the pipes and the console queue hold
  WorkerGroup group(io, options);
  group.start({shellWorker(0, "yes 0123456789 | head -n " + std::to_string(kLines))});
  CHECK(tickFor(500ms) < 200ms);  // timers run on time while the console is stuck
  CHECK(runUntil(io, [&] { return options.output.console->congested(ConsoleStream::Out); }, 10s));
  CHECK(group.running() == 1);    // the worker is blocked in its own writes

  // The reader comes back: the mux resumes and every line arrives, whole.
  std::string text;
  std::thread reader([&] {
    char buf[64 * 1024];
    for (ssize_t n; (n = ::read(outFds[0], buf, sizeof buf)) > 0;)
      text.append(buf, static_cast<size_t>(n));
  });
  CHECK(runUntil(io, [&] { return group.running() == 0; }, 60s));  // no REQUIRE: join first
  CHECK(options.output.console->drain(10s));
  ::close(std::exchange(outFds[1], -1));  // EOF for the reader (the writer is idle now)
  reader.join();
  auto lines = splitLines(text);
  CHECK(lines.size() == static_cast<size_t>(kLines));
  CHECK(std::count(lines.begin(), lines.end(), "0123456789") == kLines);
}

TEST_CASE_METHOD(StuckConsole,
                 "stopping workers whose console is stuck ends within the grace period",
                 "[agent]") {
  auto group = std::make_unique<WorkerGroup>(io, options);
  group->start({shellWorker(0, "exec yes 0123456789"), shellWorker(1, "exec yes abcdefghij")});
  CHECK(tickFor(300ms) < 200ms);
  // How soon two `yes` fill the pipes and the console queue depends on the machine's load (a
  // sanitized build under load took longer than 300 ms): wait for it, bounded.
  REQUIRE(runUntil(io, [&] { return options.output.console->congested(ConsoleStream::Out); }, 10s));
  auto start = std::chrono::steady_clock::now();
  bool stopped = false;
  group->stop(SIGTERM, 1s, [&] { stopped = true; });
  REQUIRE(runUntil(io, [&] { return stopped; }, 10s));
  group.reset();
  // The writer gives up on the stuck console at its drain deadline rather than hanging.
  options.output.console.reset();
  CHECK(std::chrono::steady_clock::now() - start < 3s);
}

TEST_CASE_METHOD(StuckConsole,
                 "an exited worker's unread lines are queued before its exit is reported",
                 "[agent]") {
  // stdout and stderr on the stuck pipe (one lane), congested as soon as anything is queued.
  ConsoleWriterOptions writerOptions{outFds[1], outFds[1]};
  writerOptions.highWaterBytes = 0;
  writerOptions.lowWaterBytes = 0;
  writerOptions.drainOnDestroy = 200ms;
  options.output.console = std::make_shared<ConsoleWriter>(writerOptions);
  auto console = options.output.console;
  ::fcntl(outFds[1], F_SETFL, ::fcntl(outFds[1], F_GETFL) | O_NONBLOCK);
  std::string fill(4096, '#');
  while (::write(outFds[1], fill.data(), fill.size()) > 0) {
  }  // the pipe is full before the worker starts: the console is stuck from its first line on

  TempDir dir;
  auto gate = dir.path() / "gate";
  REQUIRE(::mkfifo(gate.c_str(), 0600) == 0);
  auto group = std::make_unique<WorkerGroup>(io, options);
  std::optional<WorkerExit> exit;
  group->onExit([&](const WorkerExit& e) {
    exit = e;
    console->write(ConsoleStream::Err, "summary\n");  // what the agent prints next
  });
  group->start({shellWorker(0, "echo first; read go < " + gate.string() +
                                   "; yes 0123456789 | head -n 1000; echo the-end; exit 3")});
  // "first" is queued and stuck: the mux has paused the worker's stdout.
  REQUIRE(runUntil(io, [&] { return console->congested(ConsoleStream::Out); }));
  {
    std::ofstream(gate) << "go\n";  // the worker writes the rest into its (unread) pipe and exits
  }
  REQUIRE(runUntil(io, [&] { return exit.has_value(); }, 20s));
  CHECK(exit->exitCode == 3);

  // The reader comes back: the worker's lines, then the summary.
  ::fcntl(outFds[0], F_SETFL, ::fcntl(outFds[0], F_GETFL) | O_NONBLOCK);
  std::string text;
  auto readSome = [&] {
    char buf[64 * 1024];
    for (ssize_t n; (n = ::read(outFds[0], buf, sizeof buf)) > 0;)
      text.append(buf, static_cast<size_t>(n));
  };
  REQUIRE(eventually([&] {
    readSome();
    return text.find("summary\n") != std::string::npos;
  }));
  auto lines = splitLines(text.substr(text.find_first_not_of('#')));
  REQUIRE(lines.size() == 1003);
  CHECK(lines.front() == "first");
  CHECK(lines[1001] == "the-end");
  CHECK(lines.back() == "summary");
  group.reset();
}

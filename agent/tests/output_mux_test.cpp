// OutputMux (through WorkerGroup): whole prefixed lines under concurrency, routing to files and
// console, filters, partial and over-long lines, no delay, a closed console.
#include "drun/agent/output_mux.hpp"

#include <signal.h>

#include <map>
#include <set>

#include "drun/agent/worker_group.hpp"
#include "test_support.hpp"

using namespace drun::agent;
using namespace drun::agent::test;

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
  GroupOptions options = consoleOptions(out.fd(), err.fd());
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
  options.output.consoleLocalRanks = std::vector<int>{0, 1, 2, 3};  // rank 4 filtered out
  WorkerGroup group(io, options);
  std::vector<WorkerSpec> specs;
  for (int r = 0; r < 5; ++r) {
    std::string n = std::to_string(r);
    specs.push_back(shellWorker(r, "echo out-" + n + "; echo err-" + n + " >&2"));
  }
  group.start(specs);
  REQUIRE(runUntil(io, [&] { return group.running() == 0; }));
  auto outLines = splitLines(out.waitAll());
  auto errLines = splitLines(err.waitAll());
  std::set<std::string> consoleOut(outLines.begin(), outLines.end());
  std::set<std::string> consoleErr(errLines.begin(), errLines.end());
  CHECK(consoleOut == std::set<std::string>{"2:out-2", "3:out-3"});
  CHECK(consoleErr == std::set<std::string>{"1:err-1", "2:err-2", "3:err-3"});
  for (int r = 0; r < 5; ++r) {
    auto rankDir = dir.path() / "attempt_0" / std::to_string(r);
    CHECK(readFile(rankDir / "stdout.log") == "out-" + std::to_string(r) + "\n");  // raw, no prefix
    CHECK(readFile(rankDir / "stderr.log") == "err-" + std::to_string(r) + "\n");
  }
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
                 "a partial last line gets its newline and over-long lines are cut at the bound",
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
  REQUIRE(rank1.size() == 4);
  auto allX = [](const std::string& s) { return s.find_first_not_of('x') == std::string::npos; };
  CHECK(rank1[0].size() == OutputMux::kMaxLineBytes);
  CHECK(rank1[1].size() == OutputMux::kMaxLineBytes);
  CHECK(rank1[2].size() == 1000);
  CHECK((allX(rank1[0]) && allX(rank1[1]) && allX(rank1[2])));
  CHECK(rank1[3] == "end");
  CHECK(readFile(dir.path() / "0" / "stdout.log") == "abc");  // the file keeps the raw bytes
  CHECK(readFile(dir.path() / "1" / "stdout.log").size() == kLong + 5);
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

TEST_CASE("a closed console does not kill drun and files and reports go on", "[agent]") {
  TempDir dir;
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  ::close(fds[0]);  // nobody reads drun's stdout any more
  boost::asio::io_context io;
  ConsoleCapture err(io);
  GroupOptions options = consoleOptions(fds[1], err.fd());
  options.output.attemptDir = dir.path();
  auto group = std::make_unique<WorkerGroup>(io, options);
  int exits = 0;
  group->onExit([&](const WorkerExit& e) { exits += e.succeeded(); });
  group->start({lineWriter(0, 200, 100, 5000, "out"), shellWorker(1, "echo still-here >&2")});
  REQUIRE(runUntil(io, [&] { return group->running() == 0; }));
  CHECK(exits == 2);
  CHECK(err.waitAll() == "still-here\n");  // stderr, a different console, still works
  group.reset();
  ::close(fds[1]);
  auto file = readFile(dir.path() / "0" / "stdout.log");
  CHECK(std::count(file.begin(), file.end(), '\n') == 200);
}

// End-to-end tests of drun in the user's terminal: the harness runs drun with its stdout (and
// stderr, stdin) on a pseudo-terminal it opens, as an interactive shell would, or on pipes.
//   - workers get terminals of their own (isatty, window size) when drun's output is one, pipes
//     otherwise or with --tty never; lines stay whole, prefixed, without "\r\n";
//   - drun's stdin reaches global rank 0 (--stdin picks another rank, or none), from a pipe or a
//     terminal (Ctrl-D ends it);
//   - `drun ... | head -2`: the job ends promptly, as a shell pipeline does (exit 141, no restart);
//   - a progress bar's partial line reaches the console while the worker still waits.
#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>

#include "process.hpp"

using namespace drun::test;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

size_t countLines(const std::string& text, const std::string& line) {
  auto lines = splitLines(text);
  return static_cast<size_t>(std::count(lines.begin(), lines.end(), line));
}

// drun ARGS... /bin/sh -c SCRIPT, with the test's marker.
RunOptions drunShell(std::vector<std::string> args, const std::string& script,
                     const MarkerScope& marker) {
  args.insert(args.end(), {"/bin/sh", "-c", script});
  return drunCommand(std::move(args), {marker.env(), "OMP_NUM_THREADS=1"}, 30s);
}

// The console's segments (cut at '\n' and '\r') of one rank, without the prefix; fails the test
// on a non-empty segment without a prefix (two lines glued together).
std::vector<std::string> segmentsOf(const std::string& text, int rank) {
  std::vector<std::string> found;
  const std::string prefix = "[" + std::to_string(rank) + "]:";
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find_first_of("\r\n", start);
    if (end == std::string::npos) end = text.size();
    std::string segment = text.substr(start, end - start);
    start = end + 1;
    if (segment.empty()) continue;
    CHECK(segment.rfind("[", 0) == 0);
    if (segment.rfind(prefix, 0) == 0) found.push_back(segment.substr(prefix.size()));
  }
  return found;
}

const char* kEchoStdin = "while read l; do echo \"got:$l\"; done; echo eof";

}  // namespace

TEST_CASE("terminal: workers get terminals of their own with drun's window size", "[e2e]") {
  MarkerScope marker;
  RunOptions options = drunShell(
      {"--nproc-per-node", "2"},
      "test -t 1 && echo out-tty; test -t 2 && echo err-tty >&2; test -t 0 || echo in-not-tty; "
      "stty -F /dev/stdout size; printf 'a\\nb\\n'",
      marker);
  options.stdoutTerminal = options.stderrTerminal = true;
  RunResult r = run(options);
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() == 0);
  CHECK(r.out.find('\r') == std::string::npos);  // "\n" stays "\n" on the way
  for (std::string rank : {"[0]:", "[1]:"})
    for (std::string line : {"out-tty", "err-tty", "in-not-tty", "40 120", "a", "b"})
      CHECK(countLines(r.out, rank + line) == 1);
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("terminal: a resized window reaches the workers (SIGWINCH and the new size)", "[e2e]") {
  MarkerScope marker;
  // Each worker prints its size on every SIGWINCH (bounded: 20 s).
  RunOptions options = drunShell(
      {"--nproc-per-node", "2"},
      "trap 'stty -F /dev/stdout size' WINCH; echo ready; i=0; "
      "while [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done",
      marker);
  options.stdoutTerminal = options.stderrTerminal = true;
  Process p(options);
  REQUIRE(p.waitForLines("ready", 2, 20s));
  p.resizeTerminal(50, 132);
  CHECK(p.waitForLines("[0]:50 132", 1, 10s));
  CHECK(p.waitForLines("[1]:50 132", 1, 10s));
  p.signal(SIGTERM);
  RunResult r = p.wait();
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("terminal: pipes when drun's output is not a terminal or with --tty never", "[e2e]") {
  MarkerScope marker;
  const bool terminal = GENERATE(false, true);
  CAPTURE(terminal);
  RunOptions options = drunShell(terminal ? std::vector<std::string>{"--tty", "never"}
                                          : std::vector<std::string>{},
                                 "test -t 1 || echo out-pipe; test -t 2 || echo err-pipe >&2",
                                 marker);
  options.stdoutTerminal = options.stderrTerminal = terminal;
  RunResult r = run(options);
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() == 0);
  CHECK(countLines(r.out, "out-pipe") == 1);
  CHECK(countLines(terminal ? r.out : r.err, "err-pipe") == 1);
}

TEST_CASE("terminal: --tty always gives ptys even when drun's output is a pipe", "[e2e]") {
  MarkerScope marker;
  RunResult r = run(drunShell({"--tty", "always"}, "test -t 1 && echo out-tty", marker));
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.out == "out-tty\n");
  CHECK(run(drunCommand({"--tty", "sometimes", "/bin/true"})).status() == 2);
}

TEST_CASE("stdin: drun's stdin reaches global rank 0 only and EOF ends it", "[e2e]") {
  MarkerScope marker;
  RunOptions options = drunShell({"--nproc-per-node", "2"}, kEchoStdin, marker);
  options.stdinPipe = true;
  Process p(options);
  p.writeStdin("hello\n");
  REQUIRE(p.waitForLines("[0]:got:hello", 1, 20s));  // while drun's stdin stays open
  p.writeStdin("world\n");
  p.closeStdin();
  RunResult r = p.wait();
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() == 0);
  CHECK(countLines(r.out, "[0]:got:world") == 1);
  CHECK(countLines(r.out, "[0]:eof") == 1);
  CHECK(countLines(r.out, "[1]:eof") == 1);
  CHECK(!contains(r.out, "[1]:got:"));
}

TEST_CASE("stdin: --stdin picks another rank or none", "[e2e]") {
  MarkerScope marker;
  const std::string choice = GENERATE(std::string("1"), std::string("none"));
  CAPTURE(choice);
  RunOptions options =
      drunShell({"--nproc-per-node", "2", "--stdin", choice}, kEchoStdin, marker);
  options.stdinPipe = true;
  Process p(options);
  p.writeStdin("hello\n");
  p.closeStdin();
  RunResult r = p.wait();
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() == 0);
  CHECK(countLines(r.out, "[1]:got:hello") == (choice == "1" ? 1u : 0u));
  CHECK(!contains(r.out, "[0]:got:"));
  CHECK(countLines(r.out, "[0]:eof") == 1);
  CHECK(countLines(r.out, "[1]:eof") == 1);
  CHECK(run(drunCommand({"--stdin", "-1", "/bin/true"})).status() == 2);
}

TEST_CASE("stdin: breakpoint() in rank 0 takes pdb commands from drun's stdin", "[e2e]") {
  MarkerScope marker;
  RunOptions options = drunCommand(
      {"--nproc-per-node", "2", "/usr/bin/python3", "-c",
       "import os\nif os.environ['RANK'] == '0': breakpoint()\nprint('after', flush=True)"},
      {marker.env(), "OMP_NUM_THREADS=1", "PYTHONBREAKPOINT"}, 30s);
  options.stdinPipe = true;
  Process p(options);
  REQUIRE(p.waitForLines("[0]:(Pdb) ", 1, 20s));  // the prompt, a partial line, is shown
  p.writeStdin("p 6 * 7\n");
  REQUIRE(p.waitForLines("42", 1, 20s));
  p.writeStdin("c\n");
  p.closeStdin();
  RunResult r = p.wait();
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() == 0);  // not BdbQuit
  CHECK_THAT(segmentsOf(r.out, 0).back(), Catch::EndsWith("after"));  // after the last prompt
  CHECK(countLines(r.out, "[1]:after") == 1);
}

TEST_CASE("stdin: after a restart the new rank 0 reads drun's stdin", "[e2e]") {
  MarkerScope marker;
  RunOptions options = drunShell(
      {"--nproc-per-node", "2", "--max-restarts", "1"},
      "echo ready-$TORCHELASTIC_RESTART_COUNT; [ $RANK = 0 ] || exit 0; read -r l; "
      "echo \"got-$TORCHELASTIC_RESTART_COUNT:$l\"; exit $((1 - TORCHELASTIC_RESTART_COUNT))",
      marker);
  options.stdinPipe = true;
  Process p(options);
  REQUIRE(p.waitForLines("[0]:ready-0", 1, 20s));
  p.writeStdin("one\n");
  REQUIRE(p.waitForLines("[0]:got-0:one", 1, 20s));
  REQUIRE(p.waitForLines("[0]:ready-1", 1, 20s));  // the restarted rank 0
  p.writeStdin("two\n");
  p.closeStdin();
  RunResult r = p.wait();
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() == 0);
  CHECK(countLines(r.out, "[0]:got-1:two") == 1);
}

TEST_CASE("stdin: typed lines on drun's terminal reach rank 0 and Ctrl-D ends them", "[e2e]") {
  MarkerScope marker;
  RunOptions options = drunShell({"--nproc-per-node", "2"},
                                 std::string("printf '(prompt) '; ") + kEchoStdin, marker);
  options.stdoutTerminal = options.stderrTerminal = options.stdinTerminal = true;
  Process p(options);
  REQUIRE(p.waitForLines("[0]:(prompt) ", 1, 20s));  // a partial line, open on the terminal
  p.writeStdin("hello\n");  // the terminal's echo (not in `out`) ends that line on the screen
  REQUIRE(p.waitForLines("[0]:got:hello", 1, 20s));  // so the rest of it comes with its prefix
  p.closeStdin();  // Ctrl-D
  RunResult r = p.wait();
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() == 0);
  CHECK(countLines(r.out, "[0]:eof") == 1);
  CHECK_THAT(segmentsOf(r.out, 1).back(), Catch::EndsWith("eof"));  // /dev/null: at once
}

TEST_CASE("| head -2: the job ends promptly as a broken pipeline (141) without restarts",
          "[e2e]") {
  MarkerScope marker;
  // Each worker writes a line every 10 ms (bounded: 3000 lines, 30 s).
  RunOptions options = drunShell(
      {"--nproc-per-node", "2", "--max-restarts", "3"},
      "i=0; while [ $i -lt 3000 ]; do echo line $i; i=$((i+1)); sleep 0.01; done", marker);
  options.closeStdoutAfterLines = 2;
  RunResult r = run(options);
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() == 128 + SIGPIPE);  // what bash reports for `yes | head -2`'s writer
  CHECK(r.wall < 10s);                 // not the workers' 30 s
  CHECK(contains(r.err, "broken pipe"));
  CHECK(!contains(r.err, "restarting"));
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("progress bars: a partial line reaches the console while the worker waits", "[e2e]") {
  MarkerScope marker;
  const bool terminal = GENERATE(true, false);
  CAPTURE(terminal);
  // tqdm's way: '\r', the bar, no newline; then it waits (here 3 s) before the next redraw.
  // drun waits 50 ms of quiet on a terminal, 1 s into a pipe (its reader parses lines).
  RunOptions options = drunShell({"--nproc-per-node", "2"},
                                 "echo start; printf '\\r50%%'; sleep 3; printf '\\r100%%\\n'",
                                 marker);
  options.stdoutTerminal = options.stderrTerminal = terminal;
  Process p(options);
  REQUIRE(p.waitForLines("[0]:start\n", 1, 20s));
  auto started = Clock::now();
  REQUIRE(p.waitForLines("[0]:50%", 1, 5s));
  auto latency = Clock::now() - started;
  CHECK(latency < (terminal ? 500ms : 2500ms));  // generous; the worker waits 3 s
  RunResult r = p.wait();
  INFO(r.describe());
  REQUIRE(!r.timedOut);
  CHECK(r.status() == 0);
  // Each rank's redraws, each prefixed, none glued to the other rank's.
  for (int rank : {0, 1})
    CHECK(segmentsOf(r.out, rank) == std::vector<std::string>{"start", "50%", "100%"});
}

// End-to-end tests of drun's output: a worker's stdout and stderr keep the order it
// wrote them in when drun's stdout and stderr are one destination (`2>&1` into a pipe, one
// terminal), and the console keeps a worker's bytes (a lone '\r', lines over 1 MiB).
#include <catch2/catch.hpp>
#include <fstream>
#include <random>

#include "process.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

// 20 rounds of "out<i>" on stdout then "err<i>" on stderr, written by one /bin/sh.
const char* kAlternating =
    "i=1; while [ $i -le 20 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done";

std::string expectedAlternating() {
  std::string text;
  for (int i = 1; i <= 20; ++i) text += "out" + std::to_string(i) + "\nerr" + std::to_string(i) + "\n";
  return text;
}

}  // namespace

TEST_CASE("output: stdout and stderr keep their order with 2>&1 into a pipe", "[e2e]") {
  MarkerScope marker;
  // drun's stderr is its stdout's pipe, as `drun ... 2>&1 | less` makes it.
  RunOptions options;
  options.argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", drunPath().string(), "/bin/sh", "-c",
                  kAlternating};
  options.env = {marker.env()};
  auto r = run(options);
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  CHECK(r.out == expectedAlternating());
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("output: stdout and stderr keep their order on one terminal", "[e2e]") {
  MarkerScope marker;
  auto options = drunCommand({"/bin/sh", "-c", kAlternating}, {marker.env()});
  options.stdoutTerminal = options.stderrTerminal = true;
  auto r = run(options);
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  CHECK(r.out == expectedAlternating());
}

TEST_CASE("output: --log-dir still writes stdout and stderr to files of their own", "[e2e]") {
  MarkerScope marker;
  TempDir dir;
  RunOptions options;
  options.argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", drunPath().string(), "--log-dir",
                  dir.path().string(), "--rdzv-id", "order", "/bin/sh", "-c", kAlternating};
  options.env = {marker.env()};
  auto r = run(options);
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  auto slurp = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto rankDir = dir.path() / "order" / "node0" / "attempt_0" / "0";
  std::string out = slurp(rankDir / "stdout.log"), err = slurp(rankDir / "stderr.log");
  CHECK(out.find("out20\n") != std::string::npos);
  CHECK(out.find("err") == std::string::npos);
  CHECK(err.find("err20\n") != std::string::npos);
  CHECK(err.find("out") == std::string::npos);
}

TEST_CASE("output: --prefix '' passes a worker's bytes through exactly (a lone CR, a 1.5 MiB line)",
          "[e2e]") {
  MarkerScope marker;
  TempDir dir;
  std::mt19937 random(19);
  std::string bytes;
  for (int i = 0; i < 100000; ++i) {
    unsigned v = random() % 64;
    bytes += v == 0 ? '\n' : v == 1 ? '\r' : static_cast<char>(random() % 256);
  }
  bytes += "\n\r\n\rprogress\r\n";                   // a lone '\r' after '\n', twice
  bytes += std::string(3 << 19, 'x') + "\n";         // a line of 1.5 MiB
  bytes += "\r\r\n";
  auto input = dir.write("input", bytes);
  auto r = run(drunCommand({"--prefix", "", "/bin/cat", input.string()}, {marker.env()}, 60s));
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  CHECK(r.out.size() == bytes.size());
  size_t firstDifference = 0;
  while (firstDifference < std::min(r.out.size(), bytes.size()) &&
         r.out[firstDifference] == bytes[firstDifference])
    ++firstDifference;
  INFO("first difference at byte " << firstDifference);
  CHECK(r.out == bytes);
}

TEST_CASE("output: a failure with nothing on stderr shows the last stdout lines", "[e2e]") {
  MarkerScope marker;
  auto r = run(drunCommand({"/bin/sh", "-c", "echo starting; echo 'fatal: no such config'; exit 3"},
                           {marker.env()}));
  INFO(r.describe());
  CHECK(r.status() == 3);
  CHECK(r.err.find("no stderr output; last lines of stdout:") != std::string::npos);
  CHECK(r.err.find("fatal: no such config") != std::string::npos);
  CHECK(r.err.find("(no error file and no stderr output)") == std::string::npos);
}

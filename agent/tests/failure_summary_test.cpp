#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "drun/agent/failure_summary.hpp"

using namespace drun::agent;
namespace fs = std::filesystem;

namespace {
fs::path tempFile(const std::string& name, const std::string& content) {
  fs::path dir = fs::temp_directory_path() / ("drun-fs-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::path p = dir / name;
  std::ofstream(p) << content;
  return p;
}
}  // namespace

TEST_CASE("signal names", "[agent]") {
  CHECK(signalName(11) == "SIGSEGV");
  CHECK(signalName(9) == "SIGKILL");
  CHECK(signalName(15) == "SIGTERM");
}

TEST_CASE("torch @record error files are read in both shapes", "[agent]") {
  auto nested = tempFile("nested.json",
      R"({"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "Traceback: line 3", "timestamp": "1"}}})");
  auto message = readErrorFile(nested);
  REQUIRE(message);
  CHECK_THAT(*message, Catch::Contains("RuntimeError: boom") && Catch::Contains("Traceback: line 3"));
  auto flat = tempFile("flat.json", R"({"message": "plain failure"})");
  CHECK(readErrorFile(flat) == std::string("plain failure"));
  auto garbage = tempFile("garbage.json", "not json at all");
  CHECK(readErrorFile(garbage) == std::string("not json at all"));
  CHECK_FALSE(readErrorFile("/nonexistent/error.json"));
}

TEST_CASE("the summary names rank, host, code or signal, and the evidence", "[agent]") {
  WorkerExit exit;
  exit.globalRank = 5;
  exit.localRank = 1;
  exit.exitCode = 3;
  exit.pid = 1234;
  exit.when = std::chrono::system_clock::now();
  exit.stderrTail = {"line one", "last words"};
  std::string s = formatFailureSummary(makeFailureRecord(exit, "node7", "/nonexistent/error.json", 2));
  CHECK_THAT(s, Catch::StartsWith("drun: root cause: rank 5 (local_rank 1) on node7 exited with code 3"));
  CHECK_THAT(s, Catch::Contains("drun:   time: "));
  CHECK_THAT(s, Catch::Contains("last lines of stderr:\ndrun:     line one\ndrun:     last words"));
  CHECK_THAT(s, Catch::Contains("2 other worker(s)"));

  exit.signal = 11;
  auto errorFile = tempFile("e.json", R"({"message": "CUDA error"})");
  s = formatFailureSummary(makeFailureRecord(exit, "node7", errorFile, 0));
  CHECK_THAT(s, Catch::Contains("was killed by signal SIGSEGV (11)"));
  CHECK_THAT(s, Catch::Contains("error file " + errorFile.string() + ":\ndrun:     CUDA error"));
  CHECK_THAT(s, !Catch::Contains("last lines of stderr"));
}

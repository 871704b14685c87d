#include "drun/agent/failure_summary.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <vector>

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
  auto nested = tempFile(
      "nested.json",
      R"({"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": "Traceback: line 3", "timestamp": "1"}}})");
  auto file = readErrorFile(nested);
  REQUIRE(file.state == ErrorFile::State::Message);
  CHECK_THAT(file.text,
             Catch::Contains("RuntimeError: boom") && Catch::Contains("Traceback: line 3"));
  file = readErrorFile(tempFile("flat.json", R"({"message": "plain failure"})"));
  CHECK(file.state == ErrorFile::State::Message);
  CHECK(file.text == "plain failure");
  // A call stack of the wrong type costs only the call stack.
  file = readErrorFile(
      tempFile("stack.json", R"({"message": {"message": "m", "extraInfo": {"py_callstack": 5}}})"));
  CHECK(file.state == ErrorFile::State::Message);
  CHECK(file.text == "m");
  CHECK(readErrorFile("/nonexistent/error.json").state == ErrorFile::State::Absent);
}

TEST_CASE("a malformed error file says what is wrong with it and never throws", "[agent]") {
  struct Case {
    const char* name;
    std::string content;
    const char* reason;  // a part of ErrorFile::text
  };
  const std::vector<Case> cases = {
      {"inner message a number", R"({"message":{"message":1}})",
       "\"message.message\" is a number, not a string"},
      {"inner message null", R"({"message":{"message":null}})", "\"message.message\" is null"},
      {"inner message an object", R"({"message":{"message":{"message":"x"}}})",
       "is an object, not a string"},
      {"inner message missing", R"({"message":{"extraInfo":{}}})", "has no \"message\" field"},
      {"message an array", R"({"message":[1,2]})",
       "\"message\" is an array, not a string or an object"},
      {"message a boolean", R"({"message":true})", "\"message\" is a boolean"},
      {"message empty", R"({"message":""})", "\"message\" is empty"},
      {"no message", R"({"error":"x"})", "no \"message\" field"},
      {"top level array", R"(["message"])", "an array, not an object"},
      {"top level string", R"("message")", "a string, not an object"},
      {"not JSON", "not json at all", "not JSON"},
      {"truncated JSON", R"({"message": {"message": "cut)", "not JSON"},
      {"empty", "", "empty"},
      {"whitespace", " \n\t ", "empty"},
      {"binary",
       std::string("\x7f"
                   "ELF\0\x01\x02\xff\xfe",
                   9),
       "not JSON"},
      {"invalid UTF-8 in a string", "{\"message\": \"bad \xff\xfe bytes\"}", "not JSON"},
      {"deeply nested", std::string(100000, '[') + std::string(100000, ']'), "nested deeper"},
      {"deeply nested message",
       R"({"message":)" + std::string(70, '{') + std::string(70, '}') + "}", "nested deeper"},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.name) {
      ErrorFile file;
      CHECK_NOTHROW(file = readErrorFile(tempFile("malformed.json", c.content)));
      CHECK(file.state == ErrorFile::State::Malformed);
      CHECK_THAT(file.text, Catch::Contains(c.reason));
      // Quoted bytes are made printable.
      for (char ch : file.text) CHECK((ch >= 0x20 && ch < 0x7f));
    }
  }
  SECTION("larger than the bound") {
    std::string huge = R"({"message": ")" + std::string(kMaxErrorFileBytes, 'x') + R"("})";
    auto file = readErrorFile(tempFile("huge.json", huge));
    CHECK(file.state == ErrorFile::State::Unreadable);
    CHECK_THAT(file.text, Catch::Contains("larger than"));
  }
  SECTION("a directory") {
    auto dir = tempFile("placeholder", "").parent_path() / "a-directory.json";
    fs::create_directories(dir);
    auto file = readErrorFile(dir);
    CHECK(file.state == ErrorFile::State::Unreadable);
    CHECK_THAT(file.text, Catch::Contains("directory"));
  }
  SECTION("a FIFO nobody writes does not hang") {
    auto fifo = tempFile("placeholder", "").parent_path() / "fifo.json";
    fs::remove(fifo);
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    auto file = readErrorFile(fifo);
    CHECK(file.state == ErrorFile::State::Unreadable);
    CHECK_THAT(file.text, Catch::Contains("not a regular file"));
    fs::remove(fifo);
  }
}

TEST_CASE("a summary with a malformed error file names the problem and shows the stderr tail",
          "[agent]") {
  WorkerExit exit;
  exit.globalRank = 1;
  exit.localRank = 1;
  exit.exitCode = 1;
  exit.when = std::chrono::system_clock::now();
  exit.stderrTail = {"Traceback (most recent call last):", "ValueError: bad"};
  auto errorFile = tempFile("bad.json", R"({"message":{"message":1}})");
  std::string s = formatFailureSummary(makeFailureRecord(exit, "node7", errorFile, 0));
  CHECK_THAT(s, Catch::Contains("\ndrun:   error file " + errorFile.string() +
                                " is malformed: \"message.message\" is a number, not a string;"
                                " last lines of stderr:\ndrun:     Traceback (most recent call"
                                " last):\ndrun:     ValueError: bad"));
  exit.stderrTail.clear();
  s = formatFailureSummary(makeFailureRecord(exit, "node7", errorFile, 0));
  CHECK_THAT(s, Catch::Contains("is malformed") && Catch::Contains("(no stderr output)"));
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

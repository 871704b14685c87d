// drun-rendezvous --state-dir (src/state/): the jobs' history kept in DIR/state.json, written off
// the loop and read back at start as untrusted input. What is kept: every job's events; an ended
// job's outcome and round; never a running job's round.
#include <stdlib.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "drun/common/error.hpp"
#include "drun/store/store_server.hpp"
#include "state/history_file.hpp"
#include "state/state_file.hpp"
#include "state/state_keeper.hpp"

using namespace drun::rdzv;
using namespace drun::rdzv::state;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

struct ScratchDir {
  fs::path path;
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "drun-state-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~ScratchDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

std::string readAll(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void writeAll(const fs::path& file, const std::string& text) {
  std::ofstream(file, std::ios::binary) << text;
}

// Job "ended": two events, its tombstone and round keys that are not kept; job "running": an
// event and its current round (never kept).
void fillJobs(StoreCore& core) {
  core.set("rdzv/ended/events/next", "2");
  core.set("rdzv/ended/events/0", R"({"v":1,"seq":0,"event":"round_formed"})");
  core.set("rdzv/ended/events/1", R"({"v":1,"seq":1,"event":"job_ended"})");
  core.set("rdzv/ended/outcome", "succeeded");
  core.set("rdzv/ended/round", "3");
  core.set("rdzv/ended/3/status", "closed");
  core.set("rdzv/ended/config", "2\t3");
  core.set("rdzv/running/events/next", "1");
  core.set("rdzv/running/events/0", R"({"v":1,"seq":0,"event":"round_formed"})");
  core.set("rdzv/running/round", "1");
  core.set("rdzv/running/present", "2");
}

// A server on a free loopback port whose store the test can reach (before start, or on its io).
struct Daemon {
  StoreServer server{StoreServerOptions{.listen = {"127.0.0.1", 0}}};
  boost::asio::io_context* io = nullptr;
  StoreCore* core = nullptr;
  Daemon() {
    server.attach([this](boost::asio::io_context& context, StoreCore& store) {
      io = &context;
      core = &store;
    });
  }
};

// Waits (bounded) until `file` holds `text`.
bool waitForText(const fs::path& file, const std::string& text) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (readAll(file).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

std::vector<fs::path> movedAside(const fs::path& dir) {
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().starts_with("state.json.bad-")) found.push_back(entry.path());
  return found;
}

}  // namespace

TEST_CASE("state: the history text keeps events and an ended job's tombstone, never a running job's round", "[state]") {
  StoreCore core;
  fillJobs(core);
  core.set("rdzv/binary/events/next", "1");
  core.set("rdzv/binary/events/0", std::string("\xff\xfe", 2));  // not UTF-8: left out
  const HistorySnapshot snapshot = snapshotHistory(core, 1 << 20);
  CHECK(snapshot.leftOut.empty());
  const auto jobs = parseHistory(snapshot.text);
  std::map<std::string, std::map<std::string, std::string>> kept;
  for (const auto& job : jobs)
    for (const auto& [key, value] : job.entries) kept[job.runId][key] = value;
  CHECK(kept["ended"] == std::map<std::string, std::string>{
                             {"rdzv/ended/events/next", "2"},
                             {"rdzv/ended/events/0", R"({"v":1,"seq":0,"event":"round_formed"})"},
                             {"rdzv/ended/events/1", R"({"v":1,"seq":1,"event":"job_ended"})"},
                             {"rdzv/ended/outcome", "succeeded"},
                             {"rdzv/ended/round", "3"}});
  CHECK(kept["running"] == std::map<std::string, std::string>{
                               {"rdzv/running/events/next", "1"},
                               {"rdzv/running/events/0", R"({"v":1,"seq":0,"event":"round_formed"})"}});
  CHECK(kept["binary"] == std::map<std::string, std::string>{{"rdzv/binary/events/next", "1"}});
  CHECK(isHistoryKey("rdzv/x/events/255"));
  CHECK(isHistoryKey("rdzv/x/outcome"));
  CHECK_FALSE(isHistoryKey("rdzv/x/events/256"));
  CHECK_FALSE(isHistoryKey("rdzv/x/0/status"));
}

TEST_CASE("state: a text this daemon would not write is refused, saying what is wrong", "[state]") {
  const std::pair<std::string, std::string> cases[] = {
      {"", "not JSON"},
      {R"({"version":1,"jobs":{"a":{"events/next":"1")", "not JSON"},  // truncated
      {"[1,2]", "not a JSON object"},
      {R"({"version":2,"jobs":{}})", "version"},
      {R"({"version":1})", "jobs"},
      {R"({"version":1,"jobs":{"a/b":{}}})", "job \"a/b\""},
      {std::string(100000, '['), "not JSON"},
      {std::string(100000, '[') + std::string(100000, ']'), "not a JSON object"},
      {R"({"version":1,"jobs":{"a":{"0/status":"x"}}})", "is not kept history"},
      {R"({"version":1,"jobs":{"a":{"events/256":"x"}}})", "is not kept history"},
      {R"({"version":1,"jobs":{"a":{"events/next":"-1"}}})", "not a decimal counter"},
      {R"({"version":1,"jobs":{"a":{"events/0":7}}})", "not a string"},
      {R"({"version":1,"jobs":{"a":{"round":"4"}}})", "a round without an outcome"},
  };
  for (const auto& [text, what] : cases) {
    INFO(text);
    try {
      parseHistory(text);
      FAIL("accepted");
    } catch (const drun::InvalidArgument& e) {
      CHECK_THAT(e.what(), Catch::Contains(what));
    }
  }
}

TEST_CASE("state: over the cap, whole jobs are left out and the text still parses", "[state]") {
  StoreCore core;
  fillJobs(core);
  const size_t whole = snapshotHistory(core, 1 << 20).text.size();
  const HistorySnapshot capped = snapshotHistory(core, whole - 1);
  CHECK(capped.leftOut == std::vector<std::string>{"running"});
  CHECK(capped.text.size() <= whole - 1);
  const auto jobs = parseHistory(capped.text);
  REQUIRE(jobs.size() == 1);
  CHECK(jobs[0].runId == "ended");
  CHECK(snapshotHistory(core, 10).leftOut.size() == 2);
  CHECK(parseHistory(snapshotHistory(core, 10).text).empty());
}

TEST_CASE("state: the file is replaced whole, and read back bounded", "[state]") {
  ScratchDir dir;
  const fs::path file = dir.path / kStateFileName;
  CHECK_FALSE(readStateFile(file, 100).has_value());
  writeStateFile(file, "first");
  writeStateFile(file, "second");
  CHECK(readStateFile(file, 100) == std::optional<std::string>("second"));
  CHECK_FALSE(fs::exists(dir.path / "state.json.tmp"));
  CHECK_THROWS_WITH(readStateFile(file, 3), Catch::Contains("more than the 3"));
  CHECK_THROWS_WITH(readStateFile(dir.path, 100), Catch::Contains("not a regular file"));
  const fs::path aside = moveAside(file);
  CHECK(aside.filename().string().starts_with("state.json.bad-"));
  CHECK_FALSE(fs::exists(file));
  CHECK(readAll(aside) == "second");
  CHECK_THROWS_AS(writeStateFile(dir.path / "missing" / kStateFileName, "x"), drun::Error);
}

TEST_CASE("state: a daemon's kept history is restored by the next one with the same dir", "[state]") {
  ScratchDir dir;
  const fs::path file = dir.path / kStateFileName;
  {
    Daemon first;
    StateKeeper keeper(first.server, {.dir = dir.path, .flushPeriod = 50ms});
    CHECK(keeper.jobsRestored() == 0);
    first.server.start();
    boost::asio::post(*first.io, [core = first.core] { fillJobs(*core); });
    REQUIRE(waitForText(file, "succeeded"));  // written by the timer, with the server running
    keeper.stop();
    first.server.stop();
    keeper.finish();
  }
  const std::string written = readAll(file);
  CHECK(written.find("round_formed") != std::string::npos);
  CHECK(written.find("closed") == std::string::npos);

  Daemon second;
  StateKeeper keeper(second.server, {.dir = dir.path, .flushPeriod = 1h});
  CHECK(keeper.jobsRestored() == 2);
  StoreCore& core = *second.core;
  CHECK(core.tryGet("rdzv/ended/outcome") == std::optional<std::string>("succeeded"));
  CHECK(core.tryGet("rdzv/ended/round") == std::optional<std::string>("3"));
  CHECK(core.tryGet("rdzv/ended/events/1") == std::optional<std::string>(R"({"v":1,"seq":1,"event":"job_ended"})"));
  CHECK(core.tryGet("rdzv/running/events/next") == std::optional<std::string>("1"));
  CHECK_FALSE(core.tryGet("rdzv/running/round"));  // its agents refill it as a store that lacks the job
  CHECK_FALSE(core.tryGet("rdzv/ended/3/status"));

  // A change is written at finish() even before the timer's next tick.
  core.erasePrefix("rdzv/ended/");
  keeper.finish();
  CHECK(readAll(file).find("succeeded") == std::string::npos);
  CHECK(readAll(file).find("running") != std::string::npos);
}

TEST_CASE("state: a corrupt, truncated or oversized file is moved aside and the daemon starts empty", "[state]") {
  StoreCore filled;
  fillJobs(filled);
  const std::string valid = snapshotHistory(filled, 1 << 20).text;
  const std::pair<std::string, size_t> contents[] = {
      {"{not json", valid.size()},
      {valid.substr(0, valid.size() / 2), valid.size()},  // truncated
      {R"({"version":1,"jobs":{"a":{"round":"4"}}})", valid.size()},
      {valid, valid.size() - 1}};  // over the cap
  for (const auto& [content, cap] : contents) {
    INFO(content.substr(0, 80));
    ScratchDir dir;
    writeAll(dir.path / kStateFileName, content);
    Daemon daemon;
    StateKeeper keeper(daemon.server, {.dir = dir.path, .maxBytes = cap});
    CHECK(keeper.jobsRestored() == 0);
    CHECK(daemon.core->numKeys() == 0);
    CHECK_FALSE(fs::exists(dir.path / kStateFileName));
    const auto aside = movedAside(dir.path);
    REQUIRE(aside.size() == 1);
    CHECK(readAll(aside[0]) == content);
  }
}

TEST_CASE("state: a job over this daemon's store budget is not restored, the others are", "[state]") {
  ScratchDir dir;
  StoreCore filled;
  fillJobs(filled);
  filled.set("rdzv/big/events/next", "1");
  filled.set("rdzv/big/events/0", std::string(4000, 'x'));
  writeAll(dir.path / kStateFileName, snapshotHistory(filled, 1 << 20).text);
  StoreServer server(StoreServerOptions{.listen = {"127.0.0.1", 0}, .maxStoredBytesPerJob = 2048});
  StateKeeper keeper(server, {.dir = dir.path});
  CHECK(keeper.jobsRestored() == 2);
  server.attach([](boost::asio::io_context&, StoreCore& core) {
    CHECK_FALSE(core.tryGet("rdzv/big/events/next"));
    CHECK(core.tryGet("rdzv/ended/outcome"));
  });
}

TEST_CASE("state: --state-dir that cannot be a writable directory is refused", "[state]") {
  ScratchDir dir;
  writeAll(dir.path / "file", "x");
  StoreServer server(StoreServerOptions{.listen = {"127.0.0.1", 0}});
  CHECK_THROWS_WITH(StateKeeper(server, {.dir = dir.path / "file"}), Catch::Contains("--state-dir"));
  CHECK_THROWS_WITH(StateKeeper(server, {.dir = dir.path / "file" / "sub"}), Catch::Contains("--state-dir"));
}

// Standby workers of `drun --recovery in-process` (docs/recovery.md, "Standby workers"): a
// process of the program started ahead of need waits in `import drun` and takes a SIGKILLed
// rank's place (tests/torch/resilient_train.py: its pid, the rank's output prefix and log file,
// the parameters of a run without a failure; the time from the kill to the formed generation is
// printed beside a run without a standby); a program that never imports drun ends its standbys
// and the job keeps none after two; no standby outlives the job (it succeeds, it fails, drun is
// SIGKILLed).
//
// SKIPPED without torch or without the compiled drun.torch module (the first test), without
// python3 (the others).
#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "event_lines.hpp"
#include "tagged_lines.hpp"
#include "time_scale.hpp"
#include "torch_jobs.hpp"

using namespace drun::test;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

constexpr int kStandbyWorld = 3;
constexpr int kStandbySteps = 30;

struct StandbyRun {
  RunResult result;
  std::vector<json> events;
  std::map<int, std::string> final;  // rank -> hash of its final parameters
  std::vector<Tagged> enters;
  std::optional<long> formedMs;      // "generation 1 formed N ms after"
};

StandbyRun trainWith(const TempDir& dir, const std::string& name, const std::string& kill, int standbys) {
  MarkerScope marker;
  StandbyRun t;
  const auto events = dir / (name + ".jsonl");
  t.result = run(singleNode(
      marker,
      {"--standalone", "--nproc-per-node", std::to_string(kStandbyWorld), "--recovery", "in-process", "--max-restarts",
       "3", "--rdzv-conf", "standby_workers=" + std::to_string(standbys), "--events", events.string(),
       "--log-dir", (dir / name).string(), torchProgram("resilient_train.py").string()},
      {drunPythonPath(), "TRAIN_STEPS=" + std::to_string(kStandbySteps), "TRAIN_KILL=" + kill,
       "TRAIN_KILL_READY=" + std::string(standbys ? "1" : "0")}));
  t.events = readEvents(events);
  t.enters = tagged(t.result.out, "ENTER");
  for (const auto& l : tagged(t.result.out, "FINAL")) t.final[l.rank()] = l.fields.at("sum");
  std::smatch m;
  if (std::regex_search(t.result.err, m, std::regex(R"(generation 1 formed (\d+) ms after)")))
    t.formedMs = std::stol(m[1]);
  CHECK(marker.leftovers(5s).empty());  // the standby left over at the end among them
  return t;
}

std::set<long> pidsOf(const std::vector<json>& events) {
  std::set<long> out;
  for (const json& e : events) out.insert(e["pid"].get<long>());
  return out;
}

// The file under `dir` whose path ends in `tail`, read whole ("" when there is none).
std::string fileEndingIn(const std::filesystem::path& dir, const std::string& tail) {
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string path = entry.path().string();
    if (path.size() >= tail.size() && path.compare(path.size() - tail.size(), tail.size(), tail) == 0) {
      std::ifstream in(entry.path());
      std::stringstream text;
      text << in.rdbuf();
      return text.str();
    }
  }
  return "";
}

// The pids of the standby_started events in `file` so far (a line being written is skipped).
std::set<long> standbysStarted(const std::filesystem::path& file) {
  std::set<long> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const json e = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (e.is_object() && e.value("event", "") == "standby_started") out.insert(e["pid"].get<long>());
  }
  return out;
}

// Dead within a hang bound: no such process, or a zombie (re-parented when drun was SIGKILLed,
// not reaped yet).
bool gone(long pid) {
  const auto deadline = std::chrono::steady_clock::now() + 10s * timeScale();
  for (;; std::this_thread::sleep_for(20ms)) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const auto close = text.rfind(')');
    if (text.empty() || (close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'Z'))
      return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
  }
}

// A Python program for the jobs below (the agent puts drun's package on PYTHONPATH).
RunOptions pythonJob(const MarkerScope& marker, const std::filesystem::path& events, const std::string& code,
                     std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--standalone", "--nproc-per-node", "2", "--recovery", "in-process",
                                   "--rdzv-conf", "standby_workers=1", "--events", events.string()};
  args.insert(args.end(), extra.begin(), extra.end());
  for (const char* a : {kTorchPython, "-c"}) args.push_back(a);
  args.push_back(code);
  return singleNode(marker, args, {drunPythonPath()});
}

}  // namespace

TEST_CASE("a standby worker takes a SIGKILLed rank: its pid, the rank's prefix and log file, the parameters "
          "of a run without a failure", "[torch]") {
  skipWithoutDrunTorch("standby workers");
  TempDir dir;
  auto reference = trainWith(dir, "reference", "", 1);
  INFO("--- without a failure: " << reference.result.describe());
  REQUIRE(reference.result.status() == 0);
  REQUIRE(reference.final.size() == static_cast<size_t>(kStandbyWorld));
  const std::string expected = reference.final.begin()->second;
  CHECK(ofKind(reference.events, "standby_started").size() == 1);  // kept, never used

  auto standby = trainWith(dir, "standby", "1:8", 1);
  INFO("--- rank 1 SIGKILLed, a standby: " << standby.result.describe());
  REQUIRE(standby.result.status() == 0);
  REQUIRE(standby.final.size() == static_cast<size_t>(kStandbyWorld));
  for (const auto& [rank, sum] : standby.final) CHECK(sum == expected);
  CHECK(standby.result.err.find("replacing it in place: generation 1 (restart 1 of 3); a standby took rank 1") !=
        std::string::npos);
  // The replacement was the standby started before the kill: its worker_started says so, and the
  // process that entered generation 1 as rank 1 (printed under rank 1's prefix) has its pid.
  const auto standbyPids = pidsOf(ofKind(standby.events, "standby_started"));
  CHECK(standbyPids.size() == 2);  // the one taken, and the one started in its place
  std::optional<long> replacement;
  for (const json& e : ofKind(standby.events, "worker_started"))
    if (e.value("generation", 0) == 1) {
      INFO(e.dump());
      CHECK(e["rank"] == 1);
      CHECK(e["standby"] == true);
      replacement = e["pid"].get<long>();
    }
  REQUIRE(replacement);
  CHECK(standbyPids.count(*replacement) == 1);
  bool entered = false;
  for (const auto& l : standby.enters)
    if (l.fields.at("generation") == "1" && l.rank() == 1) {
      entered = true;
      CHECK(l.consoleRank == 1);
      CHECK(std::stol(l.fields.at("pid")) == *replacement);
    }
  CHECK(entered);
  // Rank 1's log file: the first process's lines, then the standby's (appended).
  const std::string log = fileEndingIn(dir / "standby", "attempt_0/1/stdout.log");
  CHECK(log.find("ENTER rank=1 generation=0") != std::string::npos);
  CHECK(log.find("ENTER rank=1 generation=1") != std::string::npos);
  CHECK(log.find("pid=" + std::to_string(*replacement)) != std::string::npos);
  CHECK(log.find("FINAL rank=1 step=" + std::to_string(kStandbySteps)) != std::string::npos);

  auto cold = trainWith(dir, "cold", "1:8", 0);
  INFO("--- rank 1 SIGKILLed, no standby: " << cold.result.describe());
  REQUIRE(cold.result.status() == 0);
  for (const auto& [rank, sum] : cold.final) CHECK(sum == expected);
  CHECK(ofKind(cold.events, "standby_started").empty());
  for (const json& e : ofKind(cold.events, "worker_started"))
    if (e.value("generation", 0) == 1) CHECK(e["standby"] == false);
  REQUIRE(standby.formedMs);
  REQUIRE(cold.formedMs);
  WARN("generation 1 formed " << *standby.formedMs << " ms after rank 1 was SIGKILLed with a standby, "
                              << *cold.formedMs << " ms without");
}

TEST_CASE("standby workers of a program that never imports drun end, after two the job keeps none and "
          "succeeds", "[torch]") {
  skipWithoutPythonModule("standby workers", "os", "python3");
  MarkerScope marker;
  TempDir dir;
  // A standby has no RANK: KeyError, at once.
  auto r = run(pythonJob(marker, dir / "events.jsonl",
                         "import os, time\nprint('PLAIN rank=' + os.environ['RANK'], flush=True)\ntime.sleep(6)"));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  CHECK(r.err.find("2 standby workers ended before they were assigned a rank") != std::string::npos);
  CHECK(ofKind(readEvents(dir / "events.jsonl"), "standby_started").size() == 2);
  std::multiset<int> ranks;
  for (const auto& l : tagged(r.out, "PLAIN")) ranks.insert(l.rank());
  CHECK(ranks == std::multiset<int>{0, 1});
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("no standby worker outlives the job: it fails, drun is SIGKILLed", "[torch]") {
  skipWithoutPythonModule("standby workers", "os", "python3");
  SECTION("the job fails (the restart budget is spent)") {
    MarkerScope marker;
    TempDir dir;
    auto r = run(pythonJob(marker, dir / "events.jsonl",
                           "import drun, os, sys, time\ntime.sleep(2)\n"
                           "sys.exit(3) if os.environ['RANK'] == '1' else time.sleep(60)",
                           {"--max-restarts", "0"}));
    INFO(r.describe());
    CHECK(r.status() == 3);
    const auto standbys = pidsOf(ofKind(readEvents(dir / "events.jsonl"), "standby_started"));
    CHECK(standbys.size() == 1);
    for (long pid : standbys) CHECK(gone(pid));
    CHECK(marker.leftovers(5s).empty());
  }
  SECTION("drun is SIGKILLed") {
    MarkerScope marker;
    TempDir dir;
    Process drun(pythonJob(marker, dir / "events.jsonl", "import drun, time\ntime.sleep(60)"));
    std::set<long> standbys;
    const auto deadline = std::chrono::steady_clock::now() + 30s * timeScale();
    while (standbys.empty() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(50ms);
      standbys = standbysStarted(dir / "events.jsonl");
    }
    REQUIRE(standbys.size() == 1);
    std::this_thread::sleep_for(1s);  // the standby is in `import drun` or on its way
    drun.signal(SIGKILL);
    drun.wait(10s);
    CHECK(marker.leftovers(10s).empty());
    for (long pid : standbys) CHECK(gone(pid));
  }
}

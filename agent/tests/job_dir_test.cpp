#include "job_dir.hpp"

#include <cstdlib>
#include <fstream>

#include <catch2/catch.hpp>

#include "drun/agent/worker_env.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using drun::agent::AgentConfig;
using drun::agent::detail::JobDir;
using drun::agent::test::TempDir;

namespace {

// Points TMPDIR (fs::temp_directory_path) at `dir` for the scope.
class TmpdirScope {
 public:
  explicit TmpdirScope(const fs::path& dir) {
    if (const char* old = std::getenv("TMPDIR")) old_ = old;
    ::setenv("TMPDIR", dir.c_str(), 1);
  }
  ~TmpdirScope() {
    if (old_.empty()) ::unsetenv("TMPDIR");
    else ::setenv("TMPDIR", old_.c_str(), 1);
  }

 private:
  std::string old_;
};

}  // namespace

TEST_CASE("job dir: without --log-dir or -r/-t it is temporary and removed with its files",
          "[agent]") {
  TempDir tmp;
  TmpdirScope scope(tmp.path());
  AgentConfig config;
  fs::path path;
  {
    JobDir dir(config);
    path = dir.path();
    CHECK(dir.temporary());
    CHECK(path.parent_path() == tmp.path());
    CHECK(path.filename().string().rfind("drun_", 0) == 0);
    fs::path attempt = dir.prepareAttempt(1, 2, 2);
    CHECK(attempt == path / "node1" / "attempt_2");
    CHECK(fs::is_directory(attempt / "0"));
    CHECK(fs::is_directory(attempt / "1"));
    std::ofstream(drun::agent::errorFilePath(attempt, 0)) << "{}";
  }
  CHECK_FALSE(fs::exists(path));
}

TEST_CASE("job dir: --log-dir DIR is DIR/<run id>, kept, and an earlier run's error file is gone",
          "[agent]") {
  TempDir tmp;
  AgentConfig config;
  config.logDir = tmp.path() / "logs";
  config.rendezvous.runId = "job7";
  fs::path stale;
  {
    JobDir dir(config);
    CHECK_FALSE(dir.temporary());
    CHECK(dir.path() == tmp.path() / "logs" / "job7");
    fs::path attempt = dir.prepareAttempt(0, 0, 1);
    stale = drun::agent::errorFilePath(attempt, 0);
    std::ofstream(stale) << "{\"message\": \"an earlier run's\"}";
    dir.prepareAttempt(0, 0, 1);  // the same --rdzv-id again
    CHECK_FALSE(fs::exists(stale));
    std::ofstream(stale) << "{}";
  }
  CHECK(fs::exists(stale));  // kept
}

TEST_CASE("job dir: --log-dir without --rdzv-id is a new none_XXXXXX each run", "[agent]") {
  TempDir tmp;
  AgentConfig config;
  config.logDir = tmp.path();
  JobDir first(config);
  JobDir second(config);
  CHECK(first.path() != second.path());
  CHECK(first.path().filename().string().rfind("none_", 0) == 0);
  CHECK_FALSE(first.temporary());
}

TEST_CASE("job dir: -r/-t without --log-dir is a kept drun_<run id>_XXXXXX under TMPDIR",
          "[agent]") {
  TempDir tmp;
  TmpdirScope scope(tmp.path());
  AgentConfig config;
  config.rendezvous.runId = "r1";
  config.output.defaultRouting.redirect = 1;
  fs::path path;
  {
    JobDir dir(config);
    path = dir.path();
    CHECK_FALSE(dir.temporary());
    CHECK(path.filename().string().rfind("drun_r1_", 0) == 0);
  }
  CHECK(fs::exists(path));
}

#include "job_dir.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <string>

#include "drun/agent/worker_env.hpp"
#include "drun/common/error.hpp"
#include "temp_dirs.hpp"

namespace drun::agent::detail {

namespace fs = std::filesystem;

namespace {

fs::path makeUniqueDir(const fs::path& parent, const std::string& stem) {
  fs::create_directories(parent);
  std::string pattern = (parent / (stem + "_XXXXXX")).string();
  if (!::mkdtemp(pattern.data())) throw Error("cannot create a directory " + pattern + ": " + std::strerror(errno));
  return pattern;
}

}  // namespace

bool routesToFiles(const OutputOptions& output) {
  if (output.defaultRouting.redirect || output.defaultRouting.tee) return true;
  if (!output.duplicateStdoutFilters.empty() || !output.duplicateStderrFilters.empty()) return true;
  for (const auto& [rank, routing] : output.routing)
    if (routing.redirect || routing.tee) return true;
  return false;
}

JobDir::JobDir(const AgentConfig& config) {
  const std::string& runId = config.rendezvous.runId;
  if (config.logDir) {
    temporary_ = false;
    try {
      if (runId == "none") {
        path_ = makeUniqueDir(*config.logDir, "none");
      } else {
        fs::create_directories(*config.logDir / runId);
        path_ = *config.logDir / runId;
      }
    } catch (const fs::filesystem_error& e) {
      throw Error("--log-dir " + config.logDir->string() + ": cannot create " +
                  (e.path1().empty() ? config.logDir->string() : e.path1().string()) + ": " +
                  e.code().message());
    } catch (const Error& e) {  // makeUniqueDir's
      throw Error("--log-dir " + config.logDir->string() + ": " + e.what());
    }
    return;
  }
  if (routesToFiles(config.output)) {
    temporary_ = false;
    path_ = makeUniqueDir(fs::temp_directory_path(), "drun_" + runId);
    return;
  }
  path_ = makeUniqueDir(fs::temp_directory_path(), "drun");
  lock_ = lockTempDir(path_);  // ours: no later drun takes it for abandoned
  removeAbandonedTempDirs(path_.parent_path());  // left by SIGKILLed druns
}

JobDir::~JobDir() {
  if (!temporary_) return;
  std::error_code ignored;
  fs::remove_all(path_, ignored);
  if (lock_ >= 0) ::close(lock_);
}

fs::path JobDir::prepareAttempt(int nodeRank, int attempt, int nprocPerNode) const {
  const fs::path dir = path_ / ("node" + std::to_string(nodeRank)) / ("attempt_" + std::to_string(attempt));
  for (int r = 0; r < nprocPerNode; ++r) {
    fs::create_directories(dir / std::to_string(r));
    std::error_code ignored;
    fs::remove(errorFilePath(dir, r), ignored);
  }
  return dir;
}

}  // namespace drun::agent::detail

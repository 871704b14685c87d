// JobDir: where one run's files go (docs/options.md, "Files"). Each attempt writes
// <job dir>/node<group rank>/attempt_<n>/<local rank>/{stdout,stderr}.log and error.json:
//   --log-dir DIR          DIR/<run id>, or DIR/none_<random> without --rdzv-id (torchrun's
//                          mkdtemp does the same): one run never reads or overwrites another's
//                          files; node<group rank> keeps nodes that share a file system apart.
//   -r/-t, no --log-dir    a new $TMPDIR/drun_<run id>_<random>, kept and named on stderr (the
//                          output would otherwise be thrown away; torchrun does the same).
//   neither                a temporary directory for the error files, removed by the destructor.
// A temporary directory is locked while it is ours (temp_dirs.hpp), and making one removes the
// ones earlier druns abandoned (SIGKILLed).
//
// Threading: the agent's loop thread. Ownership: owns the temporary directory and its lock.
#pragma once

#include <filesystem>

#include "drun/agent/agent_config.hpp"

namespace drun::agent::detail {

// Whether some rank's output goes to files (-r/-t, --duplicate-*-filters), which keeps the job dir.
bool routesToFiles(const OutputOptions& output);

class JobDir {
 public:
  // Creates the directory for `config`; throws drun::Error naming it when that fails.
  explicit JobDir(const AgentConfig& config);
  ~JobDir();  // removes a temporary directory
  JobDir(const JobDir&) = delete;
  JobDir& operator=(const JobDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // Removed at exit: summaries do not name files in it.
  bool temporary() const { return temporary_; }

  // Creates node<nodeRank>/attempt_<attempt>/<local rank> for ranks [0, nprocPerNode) and removes
  // an error file a run with the same --rdzv-id left there (it must not pass for this run's).
  // Returns the attempt's directory.
  std::filesystem::path prepareAttempt(int nodeRank, int attempt, int nprocPerNode) const;

 private:
  std::filesystem::path path_;
  bool temporary_ = true;
  int lock_ = -1;  // held on a temporary directory while it is ours
};

}  // namespace drun::agent::detail

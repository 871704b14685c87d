// RecoveryOptions: what the agent does when one of its workers fails (docs/recovery.md), from
// --recovery (PET_RECOVERY) and --rdzv-conf recovery_timeout and standby_workers. Plain aggregate with defaults.
#pragma once

#include <chrono>
#include <optional>
#include <string_view>

namespace drun::agent {

enum class RecoveryMode {
  Restart,    // any failure stops every worker and the job re-forms (torchrun's rule)
  InProcess,  // the failed worker alone is replaced; the others re-form their communicators
};

// "restart" | "in-process"; nullopt for anything else.
std::optional<RecoveryMode> parseRecoveryMode(std::string_view text);
const char* toString(RecoveryMode mode);

struct RecoveryOptions {
  RecoveryMode mode = RecoveryMode::Restart;
  // A recovery not formed this long after the death falls back to a restart of the job.
  std::chrono::milliseconds timeout{30000};
  // Standby workers per node (--rdzv-conf standby_workers): processes of the program started
  // ahead of need that take a failed rank's place (docs/recovery.md). nullopt: 1 for a Python
  // program, else 0.
  std::optional<int> standbyWorkers;
  static constexpr int kMaxStandbyWorkers = 64;
  int standbys(bool isPython) const { return inProcess() ? standbyWorkers.value_or(isPython ? 1 : 0) : 0; }

  bool inProcess() const { return mode == RecoveryMode::InProcess; }
};

}  // namespace drun::agent

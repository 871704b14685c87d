// RecoveryOptions: what the agent does when one of its workers fails (docs/recovery.md), from
// --recovery (PET_RECOVERY) and --rdzv-conf recovery_timeout. Plain aggregate with defaults.
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

  bool inProcess() const { return mode == RecoveryMode::InProcess; }
};

}  // namespace drun::agent

#include "drun/agent/recovery_options.hpp"

namespace drun::agent {

std::optional<RecoveryMode> parseRecoveryMode(std::string_view text) {
  for (RecoveryMode m : {RecoveryMode::Restart, RecoveryMode::InProcess})
    if (text == toString(m)) return m;
  return std::nullopt;
}

const char* toString(RecoveryMode mode) {
  return mode == RecoveryMode::InProcess ? "in-process" : "restart";
}

}  // namespace drun::agent

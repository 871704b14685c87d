// --rdzv-conf: its keys in one table that parsing, the error for an unknown key and --help use.
#include <algorithm>

#include "cli_parts.hpp"
#include "drun/common/env.hpp"

namespace drun::launch {
namespace {

using cli::split;
using cli::usage;

std::string durationText(std::chrono::milliseconds d) {
  return d.count() % 1000 == 0 ? std::to_string(d.count() / 1000) + "s" : std::to_string(d.count()) + "ms";
}

// The --rdzv-conf keys, one table: parsing, the error for an unknown key and --help use it.
struct ConfKey {
  const char* name;
  const char* doc;
  std::chrono::milliseconds rdzv::RendezvousOptions::*duration;  // null: not a duration
  std::string rdzv::RendezvousOptions::*path = nullptr;          // a file name
  std::chrono::milliseconds agent::RecoveryOptions::*recoveryDuration = nullptr;  // the agent's
  std::optional<int> agent::RecoveryOptions::*recoveryCount = nullptr;             // the agent's
};
const ConfKey kConfKeys[] = {
    {"join_timeout", "how long a node waits for the job to form (alias: timeout)",
     &rdzv::RendezvousOptions::joinTimeout},
    {"last_call_timeout", "wait for more nodes once MIN joined", &rdzv::RendezvousOptions::lastCallTimeout},
    {"close_timeout", "the store's host waits this long for the others to leave",
     &rdzv::RendezvousOptions::closeTimeout},
    {"replace_timeout", "after losing nodes below MIN, wait this long for replacements (0: fail "
     "at once; under SLURM 0 unless given)", &rdzv::RendezvousOptions::replaceTimeout},
    {"reconnect_timeout", "a lost store (restarted, a cut link) is retried this long; a restarted "
     "store is refilled by the survivors (the restart count goes on)",
     &rdzv::RendezvousOptions::reconnectTimeout},
    {"heartbeat_interval", "store keep-alive (alias: keep_alive_interval)",
     &rdzv::RendezvousOptions::heartbeatInterval},
    {"heartbeat_timeout", "a node silent this long is lost; a cut node fences itself within it",
     &rdzv::RendezvousOptions::heartbeatTimeout},
    {"read_timeout", "deadline of one store call", &rdzv::RendezvousOptions::readTimeout},
    {"progress_interval", "a waiting node says so at this pace (the first line after 1s)",
     &rdzv::RendezvousOptions::progressInterval},
    {"recovery_timeout", "--recovery in-process: a recovery not formed this long after the death "
     "falls back to a restart of the job", nullptr, nullptr, &agent::RecoveryOptions::timeout},
    {"standby_workers", "--recovery in-process: processes per node started ahead of need, that take a "
     "failed rank's place (0: none)", nullptr, nullptr, nullptr, &agent::RecoveryOptions::standbyWorkers},
    {"is_host", "this node hosts the store (default: when the endpoint is one of its addresses)", nullptr},
    {"token_file", "the store's shared secret, a file of mode 600 (also DRUN_RDZV_TOKEN_FILE)",
     nullptr, &rdzv::RendezvousOptions::tokenFile},
    {"etcd_user", "etcd backend: the user to authenticate as (needs etcd_password_file)", nullptr,
     &rdzv::RendezvousOptions::etcdUser},
    {"etcd_password_file", "etcd backend: a file of mode 600 whose first line is the password",
     nullptr, &rdzv::RendezvousOptions::etcdPasswordFile},
    {"etcd_cacert", "etcd backend: https, the members' certificates checked against this CA file",
     nullptr, &rdzv::RendezvousOptions::etcdCaFile},
    {"etcd_prefix", "etcd backend: every key drun writes is under it (default /drun/)", nullptr,
     &rdzv::RendezvousOptions::etcdPrefix},
    {"etcd_history_ttl", "etcd backend: an ended job's outcome and history stay this long, then "
     "etcd removes them", &rdzv::RendezvousOptions::etcdHistoryTtl},
};

}  // namespace

std::string cli::rendezvousConfHelp() {
  const rdzv::RendezvousOptions defaults;
  std::string out;
  for (const ConfKey& key : kConfKeys) {
    std::string line = std::string("  ") + key.name;
    if (key.duration)
      line += "=DURATION (" +
              (defaults.*key.duration < std::chrono::milliseconds(0) ? std::string("join_timeout")
                                                                     : durationText(defaults.*key.duration)) +
              ")";
    else if (key.recoveryDuration)
      line += "=DURATION (" + durationText(agent::RecoveryOptions{}.*key.recoveryDuration) + ")";
    else if (key.recoveryCount) line += "=N (1 for a Python program, else 0)";
    else if (key.path) line += "=PATH";
    else line += "=BOOL";
    line.resize(std::max<size_t>(line.size() + 1, 36), ' ');
    out += line + key.doc + "\n";
  }
  return out;
}

void parseRendezvousConf(const std::string& text, rdzv::RendezvousOptions& out,
                         agent::RecoveryOptions* recovery) {
  for (const std::string& item : split(text, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string::npos) throw UsageError("--rdzv-conf: '" + item + "' is not key=value");
    std::string key = item.substr(0, eq);
    std::string value = item.substr(eq + 1);
    std::string what = "--rdzv-conf " + key;
    if (key == "timeout") key = "join_timeout";  // torchrun's legacy spelling
    if (key == "keep_alive_interval") key = "heartbeat_interval";
    if (key == "store_type" && value == "tcp") continue;
    if (key == "is_host") {
      out.isHost = usage([&] { return env::parseBool(value, what); });
      continue;
    }
    const ConfKey* known = nullptr;
    for (const ConfKey& k : kConfKeys)
      if (key == k.name && (k.duration || k.path || k.recoveryDuration || k.recoveryCount)) known = &k;
    if (!known) {
      std::string names;
      for (const ConfKey& k : kConfKeys) names += (names.empty() ? "" : ", ") + std::string(k.name);
      throw UsageError("--rdzv-conf: unknown key '" + key + "' (known: " + names + ")");
    }
    if (known->recoveryCount) {
      const int count = static_cast<int>(
          usage([&] { return env::parseInt(value, what, 0, agent::RecoveryOptions::kMaxStandbyWorkers); }));
      if (recovery) recovery->*(known->recoveryCount) = count;
      continue;
    }
    if (known->path) {
      if (value.empty()) throw UsageError(what + ": needs a file name");
      out.*(known->path) = value;
      continue;
    }
    const std::chrono::milliseconds duration = usage([&] { return env::parseDuration(value, what); });
    if (known->recoveryDuration) {
      if (recovery) recovery->*(known->recoveryDuration) = duration;  // drun status: not its business
      continue;
    }
    out.*(known->duration) = duration;
  }
}

}  // namespace drun::launch

#include "standby_pool.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"

namespace drun::agent::detail {

namespace {

std::map<std::string, std::string> environmentOf(const WorkerSpec& spec) {
  std::map<std::string, std::string> out;
  for (const std::string& entry : spec.env)
    if (auto eq = entry.find('='); eq != std::string::npos) out[entry.substr(0, eq)] = entry.substr(eq + 1);
  return out;
}

}  // namespace

std::string standbyAssignment(const WorkerSpec& standby, const WorkerSpec& replacement) {
  const auto before = environmentOf(standby);
  const auto after = environmentOf(replacement);
  nlohmann::json env = nlohmann::json::object();
  nlohmann::json unset = nlohmann::json::array();
  for (const auto& [name, value] : after)
    if (auto it = before.find(name); it == before.end() || it->second != value) env[name] = value;
  for (const auto& [name, value] : before)
    if (!after.count(name)) unset.push_back(name);
  return nlohmann::json{{"env", env}, {"unset", unset}}.dump(-1, ' ', false,
                                                                nlohmann::json::error_handler_t::replace) +
         "\n";
}

StandbyPool::StandbyPool(WorkerGroup& group, Options options, WorkerSpec spec)
    : group_(group), options_(std::move(options)), spec_(std::move(spec)) {}

StandbyPool::~StandbyPool() {
  for (auto& [slot, s] : slots_) {
    if (s.held >= 0) ::close(s.held);
    std::error_code ignored;
    std::filesystem::remove(s.path, ignored);
  }
}

std::vector<StandbyPool::Started> StandbyPool::fill() {
  std::vector<Started> started;
  int live = 0;
  for (const auto& [slot, s] : slots_) live += s.live;
  for (; !stopped_ && live < options_.count; ++live) {
    const int slot = nextSlot_++;
    Slot& s = slots_[slot];
    s.path = options_.dir / ("standby_" + std::to_string(slot));
    try {
      std::error_code ignored;
      std::filesystem::remove(s.path, ignored);  // a FIFO an earlier run of this --rdzv-id left
      if (::mkfifo(s.path.c_str(), 0600) != 0)
        throw Error("cannot make " + s.path.string() + ": " + std::strerror(errno));
      WorkerSpec spec = spec_;
      spec.env.push_back("DRUN_STANDBY=" + s.path.string());
      s.pid = group_.startStandby(slot, spec);
      s.live = true;
      started.push_back({slot, s.pid});
    } catch (const std::exception& e) {
      spdlog::debug("agent: no standby workers from now on: standby {}: {}", slot, e.what());
      stop();
    }
  }
  return started;
}

std::optional<pid_t> StandbyPool::assign(const WorkerSpec& replacement, Taking taking) {
  if (stopped_) return std::nullopt;
  for (auto& [slot, s] : slots_) {
    if (!s.live) continue;
    // Opens at once only while the standby waits on it for reading (ENXIO: it does not yet).
    const int fd = ::open(s.path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      spdlog::debug("agent: standby {} is not ready: {}", slot, std::strerror(errno));
      continue;
    }
    if (auto pid = send(slot, s, fd, false, replacement)) return pid;
  }
  if (taking != Taking::Starting) return std::nullopt;
  for (auto& [slot, s] : slots_) {
    if (!s.live) continue;
    // Read and write: opens without a reader, and the line stays in the FIFO until the standby
    // opens it and reads (a FIFO's data lasts while any end is open).
    const int fd = ::open(s.path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      spdlog::debug("agent: standby {}: cannot open {}: {}", slot, s.path.string(), std::strerror(errno));
      continue;
    }
    if (auto pid = send(slot, s, fd, true, replacement)) return pid;
  }
  return std::nullopt;
}

std::optional<pid_t> StandbyPool::send(int slot, Slot& s, int fd, bool hold, const WorkerSpec& replacement) {
  WorkerSpec standby = spec_;
  standby.env.push_back("DRUN_STANDBY=" + s.path.string());
  const std::string line = standbyAssignment(standby, replacement);
  pid_t pid = 0;
  try {
    pid = group_.assign(slot, replacement.localRank, replacement.globalRank);
  } catch (const std::logic_error& e) {  // it ended, its exit not reported yet
    ::close(fd);
    spdlog::debug("agent: standby {}: {}", slot, e.what());
    return std::nullopt;
  }
  s.live = false;
  // Far below the pipe's capacity, into an empty pipe: written whole or not at all.
  const ssize_t n = ::write(fd, line.data(), line.size());
  const int error = errno;
  if (hold && n == static_cast<ssize_t>(line.size())) {
    s.held = fd;
  } else {
    ::close(fd);
  }
  if (n != static_cast<ssize_t>(line.size())) {
    ::kill(-pid, SIGKILL);
    throw Error("cannot send standby " + std::to_string(slot) + " its assignment: " +
                (n < 0 ? std::strerror(error) : "a short write"));
  }
  return pid;
}

void StandbyPool::exited(int slot) {
  if (auto it = slots_.find(slot); it != slots_.end()) it->second.live = false;
}

void StandbyPool::stop() {
  stopped_ = true;
  group_.stopStandbys();
}

}  // namespace drun::agent::detail

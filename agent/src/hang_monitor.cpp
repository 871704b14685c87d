#include "hang_monitor.hpp"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "handler_guard.hpp"

namespace drun::agent::detail {
namespace {

int64_t monotonicNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// A worker whose program is a Python interpreter (drun script.py, -m, or python3 given by hand).
bool runsPython(pid_t pid) {
  char buf[4096];
  const std::string link = "/proc/" + std::to_string(pid) + "/exe";
  ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return false;
  std::string exe(buf, static_cast<size_t>(n));
  auto slash = exe.rfind('/');
  return exe.compare(slash == std::string::npos ? 0 : slash + 1, 6, "python") == 0;
}

}  // namespace

HangMonitor::HangMonitor(boost::asio::io_context& io, const HangOptions& options, LearnedTimeouts& learned)
    : io_(io), options_(options), learned_(learned), timer_(io) {}

HangMonitor::~HangMonitor() {
  stop();
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
}

std::vector<std::filesystem::path> HangMonitor::prepare(const std::filesystem::path& attemptDir, int ranks) {
  stop();
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
  fds_.clear();
  reports_.clear();
  if (!timerFifo_) {
    try {
      timerFifo_ = std::make_unique<TimerFifo>(io_, attemptDir.parent_path() / "torch_timer.fifo");
    } catch (const std::exception& e) {
      spdlog::warn("torch's FileTimer is not served: {}", e.what());
    }
  }
  if (timerFifo_) timerFifo_->clear();
  std::vector<std::filesystem::path> paths;
  for (int r = 0; r < ranks; ++r) {
    // A channel that cannot be made (a full disk) costs that rank its hang detection, not the job.
    try {
      paths.push_back(attemptDir / std::to_string(r) / "channel");
      fds_.push_back(createChannel(paths.back().string()));
    } catch (const std::exception& e) {
      spdlog::warn("local rank {} gets no hang detection: {}", r, e.what());
      paths.back().clear();
      fds_.push_back(-1);
    }
  }
  paths_ = paths;
  return paths;
}

void HangMonitor::replacing(int localRank) {
  reports_.erase(localRank);
  if (localRank >= 0 && static_cast<size_t>(localRank) < fds_.size() && !paths_[localRank].empty()) {
    if (fds_[localRank] >= 0) ::close(fds_[localRank]);
    try {
      fds_[localRank] = createChannel(paths_[localRank].string());
    } catch (const std::exception& e) {
      spdlog::warn("local rank {} gets no hang detection: {}", localRank, e.what());
      fds_[localRank] = -1;
    }
  }
}

void HangMonitor::replaced(int localRank, pid_t pid) {
  if (localRank < 0 || static_cast<size_t>(localRank) >= pids_.size()) return;
  pids_[localRank] = pid;
  live_[localRank] = true;
  if (detector_) detector_->revive(localRank);
}

void HangMonitor::start(const std::vector<pid_t>& pids, bool python, HangHandler onHang) {
  pids_ = pids;
  live_.assign(pids.size(), true);
  python_ = python;
  onHang_ = std::move(onHang);
  detector_.emplace(options_, static_cast<int>(pids.size()), &learned_);
  someoneFinished_ = false;
  idleProbe_.emplace();
  nextIdleSampleNs_ = 0;
  running_ = true;
  poll();
}

void HangMonitor::exited(int localRank, bool succeeded) {
  if (succeeded) someoneFinished_ = true;
  if (localRank >= 0 && static_cast<size_t>(localRank) < live_.size()) live_[localRank] = false;
  if (detector_) detector_->retire(localRank);
}

void HangMonitor::stop() {
  running_ = false;
  timer_.cancel();
  for (auto& c : captures_) c->cancel();
  captures_.clear();
  killTimers_.clear();  // cancels them
}

std::filesystem::path HangMonitor::timerFile() const {
  return timerFifo_ ? timerFifo_->path() : std::filesystem::path();
}

void HangMonitor::checkTimers() {
  if (!timerFifo_ || timerFifo_->size() == 0) return;
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (const FileTimer& t : timerFifo_->expired(now)) {
    int rank = -1;
    for (size_t r = 0; r < pids_.size(); ++r)
      if (pids_[r] == t.pid || ::getpgid(static_cast<pid_t>(t.pid)) == pids_[r]) rank = static_cast<int>(r);
    if (rank < 0 || !live_[rank] || reports_.count(rank)) {
      spdlog::debug("torch timer \"{}\" of pid {} expired: not a live worker of this node", t.scope, t.pid);
      continue;
    }
    HangVerdict v;
    v.rule = "timer";
    v.section = t.scope;
    v.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::max(0.0, now - t.expiration) * 1000));
    if (t.signal <= 0) {  // torch does not reap with signal 0 either
      spdlog::warn("torch timer \"{}\" of local rank {} expired (signal 0: left running)", t.scope, rank);
      continue;
    }
    act(rank, std::move(v), t.signal);
  }
}

// --hang-idle: a rank idle that long while another local rank finished or idles too; with
// several, the one idle longest. Sampled at a quarter of the idle timeout (a /proc scan).
void HangMonitor::checkIdle(int64_t now) {
  if (now < nextIdleSampleNs_ || !reports_.empty()) return;  // one hang per attempt
  nextIdleSampleNs_ = now + std::max<int64_t>(options_.pollInterval.count(), options_.idle->count() / 4) * 1000000;
  std::vector<int64_t> idle = idleProbe_->sample(pids_, now);
  const int64_t limit = static_cast<int64_t>(options_.idle->count()) * 1000000;
  int culprit = -1, idleRanks = 0;
  for (size_t r = 0; r < idle.size(); ++r) {
    if (!live_[r] || idle[r] < limit) continue;
    ++idleRanks;
    if (culprit < 0 || idle[r] > idle[culprit]) culprit = static_cast<int>(r);
  }
  if (culprit < 0 || !(someoneFinished_ || idleRanks > 1)) return;
  HangVerdict v;
  v.rule = "idle";
  v.silentFor = std::chrono::milliseconds(idle[culprit] / 1000000);
  v.timeout = *options_.idle;
  act(culprit, std::move(v), SIGKILL);
}

const HangReport* HangMonitor::report(int localRank) const {
  auto it = reports_.find(localRank);
  return it == reports_.end() ? nullptr : &it->second;
}

void HangMonitor::poll() {
  if (!running_) return;
  checkTimers();
  const int64_t now = monotonicNs();
  // One hang per attempt (the job fails with it): of the ranks past their timeout, the one
  // silent longest, which stopped first; the others may be waiting for it.
  std::optional<std::pair<int, HangVerdict>> culprit;
  for (size_t r = 0; options_.detects() && reports_.empty() && r < fds_.size() && r < live_.size(); ++r) {
    if (!live_[r] || fds_[r] < 0) continue;
    ChannelReading reading = readChannel(fds_[r]);
    if (!reading.valid) spdlog::debug("hangs: local rank {}: channel ignored: {}", r, reading.problem);
    detector_->observe(static_cast<int>(r), reading, now);
    auto verdict = detector_->check(static_cast<int>(r), now);
    if (verdict && (!culprit || verdict->silentFor > culprit->second.silentFor))
      culprit.emplace(static_cast<int>(r), std::move(*verdict));
  }
  if (culprit) act(culprit->first, std::move(culprit->second), SIGKILL);
  if (!running_) return;  // the handler stopped us
  if (options_.idle && running_) checkIdle(now);
  if (!running_) return;
  timer_.expires_after(options_.pollInterval);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) guarded("the hang monitor", [&] { poll(); });
  });
}

void HangMonitor::act(int localRank, HangVerdict verdict, int signal) {
  HangReport& report = reports_[localRank];
  report.localRank = localRank;
  report.verdict = std::move(verdict);
  report.detected = std::chrono::system_clock::now();
  const pid_t pid = pids_[localRank];
  const bool python = python_ || runsPython(pid);
  report.stackHow = python ? "faulthandler" : "";
  if (onHang_) onHang_(report);
  if (!running_) return;
  if (python) {
    // faulthandler dumps every thread's traceback from its SIGABRT handler, then re-raises
    // (a torch timer's own signal, SIGKILL by default, would leave no stack).
    ::kill(pid, SIGABRT);
    auto timer = std::make_unique<boost::asio::steady_timer>(io_, options_.stackDeadline);
    timer->async_wait([pid, this, localRank](const boost::system::error_code& ec) {
      if (ec || localRank >= static_cast<int>(live_.size()) || !live_[localRank]) return;
      spdlog::debug("hangs: local rank {} outlived SIGABRT; SIGKILL", localRank);
      ::kill(pid, SIGKILL);
    });
    killTimers_.push_back(std::move(timer));
    return;
  }
  captures_.push_back(StackCapture::start(io_, pid, options_.stackDeadline, [this, pid, localRank, signal](StackExcerpt stack) {
    auto it = reports_.find(localRank);
    if (it != reports_.end()) {
      it->second.stackHow = stack.how;
      it->second.stackText = std::move(stack.text);
    }
    if (localRank < static_cast<int>(live_.size()) && live_[localRank]) ::kill(pid, signal);
  }));
}

}  // namespace drun::agent::detail

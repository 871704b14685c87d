#include "hang_monitor.hpp"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include <spdlog/spdlog.h>

#include "drun/agent/flight_trace.hpp"
#include "handler_guard.hpp"
#include "hang_blame.hpp"

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
    : io_(io), options_(options), learned_(learned), timer_(io), flightTimer_(io) {}

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
  // Where the workers' flight recorders write (python/src/flight_recorder.hpp: the same rule).
  const char* flightDir = std::getenv("DRUN_FLIGHT_RECORD_DIR");
  flightDir_ = flightDir && *flightDir ? std::filesystem::path(flightDir) : attemptDir;
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

void HangMonitor::start(const std::vector<pid_t>& pids, bool python, HangHandler onHang, int rankOffset) {
  pids_ = pids;
  rankOffset_ = rankOffset;
  survey_.reset();
  foundWaiting_.clear();
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
  survey_.reset();
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

// --hang-idle: ranks idle that long while another local rank finished or idles too; the
// survey blames one of them (the one not waiting for its peers, else the one idle longest).
// Sampled at a quarter of the idle timeout (a /proc scan).
void HangMonitor::checkIdle(int64_t now) {
  if (now < nextIdleSampleNs_ || !reports_.empty() || survey_) return;  // one hang per attempt
  nextIdleSampleNs_ = now + std::max<int64_t>(options_.pollInterval.count(), options_.idle->count() / 4) * 1000000;
  std::vector<int64_t> idle = idleProbe_->sample(pids_, now);
  const int64_t limit = static_cast<int64_t>(options_.idle->count()) * 1000000;
  Candidates candidates;
  for (size_t r = 0; r < idle.size(); ++r) {
    if (!live_[r] || idle[r] < limit) continue;
    HangVerdict v;
    v.rule = "idle";
    v.silentFor = std::chrono::milliseconds(idle[r] / 1000000);
    v.timeout = *options_.idle;
    candidates.emplace_back(static_cast<int>(r), std::move(v));
  }
  if (candidates.empty() || !(someoneFinished_ || candidates.size() > 1)) return;
  startSurvey(std::move(candidates), /*mayBlameWaiter=*/true);  // idle ranks have no grace to give
}

void HangMonitor::announceLearned() {
  if (!options_.learn || !onLearned_) return;
  if (announcedGeneration_ != learned_.generation) {
    announced_.clear();
    announcedGeneration_ = learned_.generation;
  }
  for (const auto& [key, seen] : learned_.seen) {
    const auto timeout = learned_.timeout(key, options_);
    if (!timeout) continue;
    auto [it, first] = announced_.try_emplace(key, *timeout);
    if (!first && *timeout * 2 < it->second * 3) continue;
    it->second = *timeout;
    LearnedNote note;
    note.key = key;
    note.timeout = *timeout;
    note.longest = std::chrono::milliseconds(seen.longestNs / 1000000);
    note.floor = *timeout == options_.learnFloor;
    onLearned_(note);
  }
}

const HangReport* HangMonitor::report(int localRank) const {
  auto it = reports_.find(localRank);
  return it == reports_.end() ? nullptr : &it->second;
}

void HangMonitor::poll() {
  if (!running_) return;
  checkTimers();
  const int64_t now = monotonicNs();
  // One hang per attempt (the job fails with it): the ranks past their timeout go to a survey
  // of every rank's stack, which blames one of them (the others may be waiting for it).
  Candidates candidates;
  for (size_t r = 0; options_.detects() && reports_.empty() && r < fds_.size() && r < live_.size(); ++r) {
    if (!live_[r] || fds_[r] < 0) continue;
    ChannelReading reading = readChannel(fds_[r]);
    if (!reading.valid) spdlog::debug("hangs: local rank {}: channel ignored: {}", r, reading.problem);
    detector_->observe(static_cast<int>(r), reading, now);
    if (auto verdict = detector_->check(static_cast<int>(r), now)) candidates.emplace_back(static_cast<int>(r), std::move(*verdict));
  }
  if (!candidates.empty() && !survey_) {
    // A waiter is blamed only once it had the waiter's grace: its peer may be named elsewhere.
    const bool graced = std::all_of(candidates.begin(), candidates.end(), [&](const auto& c) { return foundWaiting_.count(c.first) > 0; });
    startSurvey(std::move(candidates), graced);
  }
  if (!running_) return;  // the handler stopped us
  announceLearned();
  if (options_.idle && running_) checkIdle(now);
  if (!running_) return;
  timer_.expires_after(options_.pollInterval);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) guarded("the hang monitor", [&] { poll(); });
  });
}

void HangMonitor::startSurvey(Candidates candidates, bool mayBlameWaiter) {
  survey_.emplace();
  survey_->candidates = std::move(candidates);
  survey_->mayBlameWaiter = mayBlameWaiter;
  askFlightRecords();
  for (size_t r = 0; r < pids_.size() && r < live_.size(); ++r) {
    if (!live_[r] || pids_[r] <= 0) continue;
    ++survey_->pending;
    const int rank = static_cast<int>(r);
    captures_.push_back(StackCapture::start(io_, pids_[r], options_.stackDeadline, [this, rank](StackExcerpt stack) {
      if (!survey_) return;
      survey_->stacks[rank] = std::move(stack);
      if (--survey_->pending == 0) blame();
    }));
  }
  if (survey_->pending == 0) blame();
}

void HangMonitor::blame() {
  if (!flightRecordsWritten()) {
    flightTimer_.expires_after(std::chrono::milliseconds(50));
    flightTimer_.async_wait([this](const boost::system::error_code& ec) {
      if (!ec && survey_) guarded("the hang monitor's blame", [&] { blame(); });
    });
    return;
  }
  Survey survey = std::move(*survey_);
  survey_.reset();
  if (!running_ || !reports_.empty()) return;
  std::vector<SurveyedRank> ranks;
  for (size_t r = 0; r < pids_.size() && r < live_.size(); ++r) {
    if (!live_[r]) continue;
    SurveyedRank s;
    s.localRank = static_cast<int>(r);
    for (const auto& [rank, verdict] : survey.candidates)
      if (rank == s.localRank) {
        s.candidate = true;
        s.silentFor = verdict.silentFor;
      }
    s.collective = detector_ ? detector_->collective(s.localRank) : std::string();
    if (auto it = survey.stacks.find(s.localRank); it != survey.stacks.end())
      s.activity = classifyStack(it->second.raw, pids_[r]);
    ranks.push_back(std::move(s));
  }
  Blame b = chooseCulprit(ranks, rankOffset_, survey.mayBlameWaiter);
  if (std::string flight = b.culprit >= 0 ? flightFindings() : ""; !flight.empty()) b.why += "; flight records: " + flight;
  if (b.culprit < 0) {
    for (const auto& [rank, verdict] : survey.candidates) {
      spdlog::debug("hangs: local rank {} is past its timeout but waits for a peer: it gets a waiter's grace", rank);
      if (detector_) detector_->markWaiting(rank);
      foundWaiting_.insert(rank);
    }
    return;
  }
  for (auto& [rank, verdict] : survey.candidates) {
    if (rank != b.culprit) continue;
    auto stack = survey.stacks.find(rank);
    act(rank, std::move(verdict), SIGKILL, stack == survey.stacks.end() ? nullptr : &stack->second, std::move(b.why));
    return;
  }
}

void HangMonitor::askFlightRecords() {
  std::vector<FlightRecord> records;
  try {
    records = readFlightRecords(flightDir_);
  } catch (const std::exception& e) {
    spdlog::debug("hangs: flight records: {}", e.what());
    return;
  }
  // Files are stamped with the kernel's coarse clock (a tick behind): a margin below it.
  survey_->flightAsked = std::filesystem::file_time_type::clock::now() - std::chrono::milliseconds(20);
  survey_->askedAt = std::chrono::steady_clock::now();
  for (const FlightRecord& record : records)
    for (size_t r = 0; r < pids_.size() && r < live_.size(); ++r)
      if (live_[r] && pids_[r] > 0 && record.pid == pids_[r] && ::kill(pids_[r], SIGUSR2) == 0)
        survey_->flightFiles.push_back(record.file);
}

// Each asked rank rewrote its record since (its recorder's thread answers SIGUSR2 once the stack
// tools let the process go), or a second went by: a rank that cannot answer does not hold the
// verdict up.
bool HangMonitor::flightRecordsWritten() const {
  if (!survey_ || std::chrono::steady_clock::now() - survey_->askedAt > std::chrono::seconds(1)) return true;
  for (const auto& file : survey_->flightFiles) {
    std::error_code ec;
    const auto written = std::filesystem::last_write_time(file, ec);
    if (ec || written < survey_->flightAsked) return false;
  }
  return true;
}

// The records the ranks wrote for SIGUSR2 (during the survey's stack captures): the ranks that
// never entered a collective, the collectives they disagree on.
std::string HangMonitor::flightFindings() const {
  try {
    std::vector<FlightRecord> records = readFlightRecords(flightDir_);
    // A record still as its recorder started it was not rewritten for this hang: not evidence.
    records.erase(std::remove_if(records.begin(), records.end(), [](const FlightRecord& r) { return r.reason == "started"; }),
                  records.end());
    if (records.empty()) return "";
    FlightFindings f = analyzeFlightRecords(records);
    std::string out;
    for (const auto* lines : {&f.neverEntered, &f.disagree})
      for (const std::string& line : *lines) out += (out.empty() ? "" : "; ") + line;
    return out;
  } catch (const std::exception& e) {
    return std::string("unreadable (") + e.what() + ")";
  }
}

void HangMonitor::act(int localRank, HangVerdict verdict, int signal, const StackExcerpt* taken, std::string blame) {
  HangReport& report = reports_[localRank];
  report.localRank = localRank;
  report.verdict = std::move(verdict);
  report.blame = std::move(blame);
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
  if (taken) {
    report.stackHow = taken->how;
    report.stackText = taken->text;
    ::kill(pid, signal);
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

#include "op_progress.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <string_view>

#include "drun/worker.h"

#include "drun/common/error.hpp"
#include "drun/common/owned_thread.hpp"

namespace drun::comm::detail {
namespace {

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// "3", "1, 4"
std::string listRanks(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

}  // namespace

OpProgress::OpProgress(std::shared_ptr<rdzv::LivenessStore> store, std::string commKey,
                       std::string commName, int rank, int size, Options options)
    : store_(std::move(store)), commKey_(std::move(commKey)), commName_(std::move(commName)), rank_(rank),
      size_(size), options_(options) {}

// Without a heap allocation: it runs on a collective's path.
void OpProgress::describe(char (&out)[160], const char* kind, uint64_t n, const std::string& commName) {
  char* end = out + sizeof(out) - 1;
  char* p = out;
  auto put = [&](std::string_view text) {
    const size_t len = std::min<size_t>(text.size(), static_cast<size_t>(end - p));
    std::memcpy(p, text.data(), len);
    p += len;
  };
  put(kind);
  put(" #");
  p = std::to_chars(p, end, n).ptr;
  put(" of ");
  put(commName);
  *p = '\0';
}

OpProgress::~OpProgress() {
  {
    std::lock_guard lock(stopMutex_);
    stopping_ = true;
  }
  stopCv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

std::string OpProgress::rankKey(int rank) const {
  return "progress/" + commKey_ + "/" + std::to_string(rank);
}

std::string OpProgress::countKey(uint64_t n) const {
  return "progress/" + commKey_ + "/in/" + std::to_string(n);
}

void OpProgress::entered(uint64_t n, const char* kind, milliseconds timeout) {
  const milliseconds after = std::min(options_.publishAfter, timeout / 4);
  publishAfterNs_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(after).count(),
                        std::memory_order_relaxed);
  kind_.store(kind, std::memory_order_relaxed);
  current_.store(n, std::memory_order_seq_cst);  // no clock read here: the watchdog times it
  std::call_once(started_, [this] {
    try {
      watchdog_ = spawnThreadWithSignalsBlocked([this] { watch(); });
      watching_.store(true, std::memory_order_relaxed);
    } catch (const std::system_error& e) {
      spdlog::warn("drun comm: no progress watchdog ({}): a timeout will not name absent ranks", e.what());
    }
  });
  if (markDue_.load(std::memory_order_relaxed) || !watching_.load(std::memory_order_relaxed)) {
    markDue_.store(false, std::memory_order_relaxed);
    mark(n, false);
  }
}

// current_ and marked_ are stored and loaded seq_cst on both sides: either the watchdog sees
// that the collective ended and leaves it unmarked, or left() sees the mark and ends it.
void OpProgress::left() {
  current_.store(0, std::memory_order_seq_cst);
  if (marked_.load(std::memory_order_seq_cst) == 0) return;
  std::lock_guard lock(markMutex_);
  if (marked_.load(std::memory_order_relaxed) == 0) return;  // the watchdog's mark was withdrawn
  drun_worker_collective_end();
  marked_.store(0, std::memory_order_relaxed);
}

void OpProgress::mark(uint64_t n, bool fromWatchdog) {
  std::lock_guard lock(markMutex_);
  if (marked_.load(std::memory_order_relaxed) == n) return;
  marked_.store(n, std::memory_order_seq_cst);
  if (fromWatchdog && current_.load(std::memory_order_seq_cst) != n) {  // over (or the next one)
    marked_.store(0, std::memory_order_relaxed);
    return;
  }
  char what[160];
  describe(what, kind_.load(std::memory_order_relaxed), n, commName_);
  drun_worker_collective_begin(what);
}

void OpProgress::publish(uint64_t n) {
  std::lock_guard lock(publishMutex_);
  if (published_ >= n) return;
  store_->set(rankKey(rank_), std::to_string(n));
  store_->add(countKey(n), 1);
  published_ = n;
}

void OpProgress::watch() {
  std::unique_lock lock(stopMutex_);
  uint64_t seen = 0;      // the collective this watchdog saw in progress last
  int64_t seenSinceNs = 0;  // when it began, at the earliest: a poll before it was first seen
  const int64_t pollNs = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.poll).count();
  while (!stopCv_.wait_for(lock, options_.poll, [&] { return stopping_; })) {
    markDue_.store(true, std::memory_order_relaxed);
    const uint64_t n = current_.load(std::memory_order_seq_cst);
    if (n == 0) continue;
    if (marked_.load(std::memory_order_seq_cst) != n) mark(n, true);
    if (n != seen) {  // entered within the last poll: publish at most a poll early, never late
      seen = n;
      seenSinceNs = nowNs() - pollNs;
    }
    const int64_t ranFor = nowNs() - seenSinceNs;
    if (ranFor < publishAfterNs_.load(std::memory_order_relaxed)) continue;
    lock.unlock();
    try {
      publish(n);
    } catch (const std::exception& e) {
      // The store is gone or refuses: the timeout then names nobody; the op itself goes on.
      spdlog::debug("drun comm: could not publish progress #{}: {}", n, e.what());
    }
    lock.lock();
  }
}

std::string OpProgress::describeAbsent(uint64_t n, const std::string& what) {
  if (!store_ || size_ < 2) return {};
  const int64_t size = size_;
  try {
    publish(n);
    // Every rank in the op publishes within publishAfter of entering: wait for the count.
    const auto publishAfter = std::chrono::duration_cast<milliseconds>(
        std::chrono::nanoseconds(publishAfterNs_.load(std::memory_order_relaxed)));
    Deadline deadline(publishAfter + 2 * options_.poll + milliseconds(100));
    std::optional<rdzv::Bytes> count = store_->tryGet(countKey(n));
    while (!deadline.expired() && (!count || std::stoll(*count) < size)) {
      try {
        count = store_->watch(countKey(n), count, deadline.remaining());
      } catch (const TimeoutError&) {
        break;
      }
    }
    if (count && std::stoll(*count) >= size) return {};
    std::vector<int> absent;
    for (int r = 0; r < size_ && absent.size() < kMaxNamed; ++r) {
      if (r == rank_) continue;
      auto v = store_->tryGet(rankKey(r));
      if (!v || std::stoull(*v) < n) absent.push_back(r);
    }
    if (absent.empty()) return {};
    const int64_t missing = size - (count ? std::stoll(*count) : 0);
    std::string text = (absent.size() == 1 ? "rank " : "ranks ") + listRanks(absent);
    if (static_cast<int64_t>(absent.size()) < missing) text += " (" + std::to_string(missing) + " in all)";
    return text + " never entered " + what;
  } catch (const std::exception& e) {
    // A forged or unreadable entry, or the store gone: the timeout says what it knows.
    spdlog::debug("drun comm: progress of {} unreadable: {}", what, e.what());
    return {};
  }
}

}  // namespace drun::comm::detail

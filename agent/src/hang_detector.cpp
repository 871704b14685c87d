#include "hang_detector.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "drun/common/error.hpp"
#include "drun/worker_channel.h"

namespace drun::agent::detail {
namespace {

template <typename T>
T load(const unsigned char* page, int offset) {
  T value;
  std::memcpy(&value, page + offset, sizeof value);
  return value;
}

constexpr int64_t kMaxSpanNs = int64_t{1} << 60;  // a sum that cannot overflow

std::chrono::milliseconds toMs(int64_t ns) { return std::chrono::milliseconds(std::max<int64_t>(ns, 0) / 1000000); }

// A NUL-terminated printable name of at most DRUN_CHANNEL_SECTION_MAX bytes; else `problem`.
bool readName(const unsigned char* at, const char* what, std::string& out, std::string& problem) noexcept {
  const char* name = reinterpret_cast<const char*>(at);
  const size_t len = ::strnlen(name, DRUN_CHANNEL_SECTION_MAX);
  if (len == DRUN_CHANNEL_SECTION_MAX) {
    problem = std::string(what) + " not NUL-terminated";
    return false;
  }
  for (size_t i = 0; i < len; ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c >= 0x7f) {
      problem = std::string(what) + " not printable";
      return false;
    }
  }
  try {
    out.assign(name, len);
  } catch (...) {
    problem = "out of memory";
    return false;
  }
  return true;
}

}  // namespace

std::string humanSeconds(std::chrono::milliseconds d) {
  char buf[32];
  if (d.count() < 1000) std::snprintf(buf, sizeof buf, "%lldms", static_cast<long long>(d.count()));
  else if (d.count() < 100000) std::snprintf(buf, sizeof buf, "%.1fs", d.count() / 1000.0);
  else std::snprintf(buf, sizeof buf, "%.0fs", d.count() / 1000.0);
  return buf;
}

int createChannel(const std::string& path) {
  ::unlink(path.c_str());  // a file left by an earlier run with the same directory
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) throw Error("cannot create the worker channel " + path + ": " + std::strerror(errno));
  unsigned char page[DRUN_CHANNEL_SIZE] = {};
  const uint32_t magic = DRUN_CHANNEL_MAGIC, version = DRUN_CHANNEL_VERSION;
  std::memcpy(page + DRUN_CHANNEL_OFF_MAGIC, &magic, sizeof magic);
  std::memcpy(page + DRUN_CHANNEL_OFF_VERSION, &version, sizeof version);
  if (::pwrite(fd, page, sizeof page, 0) != static_cast<ssize_t>(sizeof page)) {
    int e = errno;
    ::close(fd);
    throw Error("cannot write the worker channel " + path + ": " + std::strerror(e));
  }
  return fd;
}

ChannelReading readChannel(int fd) noexcept {
  ChannelReading r;
  unsigned char page[DRUN_CHANNEL_USED];
  // Twice around the section fields (the seqlock); a busy lock keeps the last poll's section.
  for (int attempt = 0; attempt < 3; ++attempt) {
    ssize_t n = ::pread(fd, page, sizeof page, 0);
    if (n != static_cast<ssize_t>(sizeof page)) {
      r.problem = n < 0 ? std::string("read: ") + std::strerror(errno) : "short read (the file was truncated)";
      return r;
    }
    if (load<uint32_t>(page, DRUN_CHANNEL_OFF_MAGIC) != DRUN_CHANNEL_MAGIC ||
        load<uint32_t>(page, DRUN_CHANNEL_OFF_VERSION) != DRUN_CHANNEL_VERSION) {
      r.problem = "bad magic or version";
      return r;
    }
    const uint64_t seq = load<uint64_t>(page, DRUN_CHANNEL_OFF_SEQ);
    r.beats = load<uint64_t>(page, DRUN_CHANNEL_OFF_BEATS);
    r.lastBeatNs = load<int64_t>(page, DRUN_CHANNEL_OFF_LAST_BEAT_NS);
    if (seq & 1) {
      r.sectionStable = false;
      continue;
    }
    uint64_t again = 0;
    if (::pread(fd, &again, sizeof again, DRUN_CHANNEL_OFF_SEQ) != static_cast<ssize_t>(sizeof again) ||
        again != seq) {
      r.sectionStable = false;
      continue;
    }
    r.sectionStable = true;
    r.sectionSeq = load<uint64_t>(page, DRUN_CHANNEL_OFF_SECTION_SEQ);
    r.sectionStartNs = load<int64_t>(page, DRUN_CHANNEL_OFF_SECTION_START_NS);
    r.collectiveStartNs = load<int64_t>(page, DRUN_CHANNEL_OFF_COLL_START_NS);
    if (!readName(page + DRUN_CHANNEL_OFF_SECTION, "section name", r.section, r.problem) ||
        !readName(page + DRUN_CHANNEL_OFF_COLLECTIVE, "collective", r.collective, r.problem))
      return r;
    break;
  }
  r.valid = true;
  return r;
}

void LearnedTimeouts::note(const std::string& key, int64_t intervalNs, int times) {
  if (intervalNs <= 0 || times <= 0) return;
  Seen& s = seen[key];
  s.longestNs = std::max(s.longestNs, intervalNs);
  s.count = static_cast<int>(std::min<int64_t>(int64_t{s.count} + times, 1 << 30));
  const int64_t added = intervalNs > kMaxSpanNs / times ? kMaxSpanNs : intervalNs * times;
  s.spanNs = std::min(s.spanNs, kMaxSpanNs) + std::min(added, kMaxSpanNs);  // both <= 2^60: no overflow
  s.spanNs = std::min(s.spanNs, kMaxSpanNs);
}

void LearnedTimeouts::forget() {
  seen.clear();
  ++generation;
}

std::string LearnedTimeouts::encode() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "g " + std::to_string(generation) + "\n";
  for (const auto& [key, s] : seen) {
    out += "k";  // a key of its own even when empty (heartbeat intervals)
    for (unsigned char c : key) out += {kHex[c >> 4], kHex[c & 15]};
    out += " " + std::to_string(s.longestNs) + " " + std::to_string(s.count) + " " + std::to_string(s.spanNs) + "\n";
  }
  return out;
}

void LearnedTimeouts::mergeEncoded(const std::string& text) {
  // Their generation first: an older one is ignored, a newer one replaces what we have.
  unsigned long long theirs = 0;
  if (std::sscanf(text.c_str(), "g %llu\n", &theirs) != 1) theirs = 0;
  if (theirs < generation) return;
  if (theirs > generation) {
    seen.clear();
    generation = theirs;
  }
  size_t at = 0;
  while (at < text.size() && at < 64 * 1024) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    at = end + 1;
    std::istringstream fields(line);
    std::string name, extra;
    long long longest = -1, count = -1, span = -1;
    if (!(fields >> name >> longest >> count >> span) || (fields >> extra) || name.empty() || name[0] != 'k')
      continue;
    const std::string hex = name.substr(1);
    if (hex.size() % 2 || hex.size() / 2 >= DRUN_CHANNEL_SECTION_MAX ||
        hex.find_first_not_of("0123456789abcdef") != std::string::npos)
      continue;
    std::string key;
    bool printable = true;
    for (size_t i = 0; i < hex.size(); i += 2) {
      const char c = static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
      printable = printable && c >= 0x20 && c < 0x7f;
      key += c;
    }
    if (!printable || longest < 0 || count < 0 || span < 0 || (!seen.count(key) && seen.size() >= kMaxKeys)) continue;
    Seen& s = seen[key];
    s.longestNs = std::max<int64_t>(s.longestNs, longest);
    s.count = std::max<int>(s.count, static_cast<int>(std::min<long long>(count, 1 << 30)));
    s.spanNs = std::max<int64_t>(s.spanNs, std::min<long long>(span, kMaxSpanNs));
  }
}

std::optional<std::chrono::milliseconds> LearnedTimeouts::timeout(const std::string& key,
                                                                  const HangOptions& o) const {
  auto it = seen.find(key);
  if (it == seen.end() || it->second.count < o.warmup ||
      it->second.spanNs < static_cast<int64_t>(o.warmupSpan.count()) * 1000000)
    return std::nullopt;
  auto learned = std::chrono::milliseconds(static_cast<int64_t>(o.factor * toMs(it->second.longestNs).count()));
  return std::max(learned, o.learnFloor);
}

std::string HangVerdict::describe() const {
  std::string out;
  if (rule == "section" || (rule == "learned" && !section.empty()))
    out = "in section \"" + section + "\" for " + humanSeconds(inSectionFor) + " (" +
          (rule == "learned" ? "learned timeout " : "its timeout ") + humanSeconds(timeout) +
          "), last heartbeat " + humanSeconds(silentFor) + " ago";
  else if (rule == "timer")
    out = "torch timer \"" + section + "\" expired (torch.distributed.elastic.timer)";
  else if (rule == "idle")
    out = "no CPU time and no output for " + humanSeconds(silentFor) + " (--hang-idle " + humanSeconds(timeout) + ")";
  else
    out = "no heartbeat for " + humanSeconds(silentFor) + " (" +
          (rule == "learned" ? "learned timeout " : "hang timeout ") + humanSeconds(timeout) + ")" +
          (section.empty() ? "" : ", in section \"" + section + "\" for " + humanSeconds(inSectionFor));
  if (!collective.empty())
    out += ", waiting in " + collective + " for " + humanSeconds(inCollectiveFor);
  return out;
}

HangDetector::HangDetector(const HangOptions& options, int ranks, LearnedTimeouts* learned)
    : options_(options), learned_(learned), ranks_(static_cast<size_t>(std::max(ranks, 0))) {}

void HangDetector::observe(int rank, const ChannelReading& reading, int64_t nowNs) {
  if (rank < 0 || static_cast<size_t>(rank) >= ranks_.size() || !reading.valid) return;
  Rank& r = ranks_[rank];
  const bool learn = options_.learn && learned_;
  if (reading.beats != r.beats) {
    // The worker's clock is CLOCK_MONOTONIC too; an implausible stamp counts as "now".
    int64_t at = reading.lastBeatNs;
    if (at > nowNs || at <= 0 || (r.beating && at < r.lastBeatNs)) at = nowNs;
    if (learn && r.beating) {
      const uint64_t delta = reading.beats > r.beats ? reading.beats - r.beats : 1;
      const int64_t beats = static_cast<int64_t>(std::min<uint64_t>(delta, 1u << 20));
      learned_->note("", (at - r.lastBeatNs) / beats, static_cast<int>(beats));
    }
    r.beats = reading.beats;
    r.lastBeatNs = at;
    r.waiting = false;
    r.beating = true;
  }
  if (!reading.sectionStable) return;
  if (reading.collective != r.collective) {
    int64_t start = reading.collectiveStartNs;
    r.collectiveStartNs = reading.collective.empty() ? 0 : (start > nowNs || start <= 0 ? nowNs : start);
    r.collective = reading.collective;
  }
  if (reading.sectionSeq == r.sectionSeq && reading.section == r.section) return;
  int64_t start = reading.sectionStartNs;
  if (!reading.section.empty() && (start > nowNs || start <= 0)) start = nowNs;
  if (learn && !r.section.empty()) {
    // The section that ended: until the next one began, or until the last beat (its end beats).
    // Several between two polls (short steps): their mean, gaps included (a longer timeout).
    const int64_t end = reading.section.empty() ? r.lastBeatNs : start;
    const uint64_t entered = std::max<uint64_t>(reading.sectionSeq - r.sectionSeq, 1);
    if (entered <= (1u << 20) && end > r.sectionStartNs)
      learned_->note(r.section, (end - r.sectionStartNs) / static_cast<int64_t>(entered), static_cast<int>(entered));
  }
  r.section = reading.section;
  r.sectionSeq = reading.sectionSeq;
  r.sectionStartNs = reading.section.empty() ? 0 : start;
}

std::optional<HangVerdict> HangDetector::check(int rank, int64_t nowNs) const {
  if (rank < 0 || static_cast<size_t>(rank) >= ranks_.size()) return std::nullopt;
  const Rank& r = ranks_[rank];
  if (!r.live || !r.beating) return std::nullopt;
  HangVerdict v;
  v.section = r.section;
  v.silentFor = toMs(nowNs - r.lastBeatNs);
  v.inSectionFor = r.section.empty() ? std::chrono::milliseconds(0) : toMs(nowNs - r.sectionStartNs);
  v.collective = r.collective;
  v.inCollectiveFor = r.collective.empty() ? std::chrono::milliseconds(0) : toMs(nowNs - r.collectiveStartNs);
  // A rank silent inside a collective waits for its peers: twice the time, so that the peer that
  // never came (silent outside it) is named first, on this node or on its own.
  const int grace = r.collective.empty() && !r.waiting ? 1 : 2;
  const bool learn = options_.learn && learned_;
  if (!r.section.empty()) {
    // A section with a timeout of its own: that timeout bounds it, heartbeats or not.
    std::optional<std::chrono::milliseconds> timeout;
    if (auto it = options_.sections.find(r.section); it != options_.sections.end()) {
      timeout = it->second;
      v.rule = "section";
    } else if (learn && (timeout = learned_->timeout(r.section, options_))) {
      v.rule = "learned";
    }
    if (timeout) {
      if (v.inSectionFor <= grace * *timeout) return std::nullopt;
      v.timeout = grace * *timeout;
      return v;
    }
    if (learn && !options_.silence) return std::nullopt;  // a section not learned yet
  }
  std::optional<std::chrono::milliseconds> silence = options_.silence;
  v.rule = "no heartbeat";
  if (!silence && learn && (silence = learned_->timeout("", options_))) v.rule = "learned";
  if (!silence || v.silentFor <= grace * *silence) return std::nullopt;
  v.timeout = grace * *silence;
  return v;
}

void HangDetector::retire(int rank) {
  if (rank >= 0 && static_cast<size_t>(rank) < ranks_.size()) ranks_[rank].live = false;
}

void HangDetector::revive(int rank) {
  if (rank >= 0 && static_cast<size_t>(rank) < ranks_.size()) ranks_[rank] = Rank{};
}

void HangDetector::markWaiting(int rank) {
  if (rank >= 0 && static_cast<size_t>(rank) < ranks_.size()) ranks_[rank].waiting = true;
}

std::string HangDetector::collective(int rank) const {
  return rank >= 0 && static_cast<size_t>(rank) < ranks_.size() ? ranks_[rank].collective : std::string();
}

bool HangDetector::everBeat(int rank) const {
  return rank >= 0 && static_cast<size_t>(rank) < ranks_.size() && ranks_[rank].beating;
}

}  // namespace drun::agent::detail

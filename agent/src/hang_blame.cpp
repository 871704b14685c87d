#include "hang_blame.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <sstream>
#include <string_view>

namespace drun::agent::detail {
namespace {

// A main thread with one of these in any frame is inside a collective or a store call: torch's
// c10d (ProcessGroupGloo/NCCL, Work::wait, TCPStore, the DDP reducer), Gloo's transport, NCCL,
// drun's torch backend and libdrun_comm (C++ and its C API).
constexpr std::array<std::string_view, 6> kWaitingFrames = {"c10d::", "gloo::", "nccl", "drun::torch_backend::",
                                                            "drun::comm::", "drun_comm_"};
// Kernel wait channels of a sleep: the thread waits for nobody (a /proc stack has nothing better).
constexpr std::array<std::string_view, 3> kSleepChannels = {"hrtimer_nanosleep", "do_nanosleep", "nanosleep"};
constexpr size_t kMaxOthersNamed = 8;

bool startsWith(std::string_view text, std::string_view prefix) { return text.substr(0, prefix.size()) == prefix; }

bool hasAny(std::string_view text, const auto& needles) {
  return std::any_of(needles.begin(), needles.end(), [&](std::string_view n) { return text.find(n) != std::string_view::npos; });
}

// "c10d::Work::wait" from "c10d::Work::wait(std::chrono::...)", "clock_nanosleep" from
// "clock_nanosleep@GLIBC_2.2.5": the name a reader recognises.
std::string shortName(std::string_view name) {
  while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
  if (auto paren = name.find('('); paren != std::string_view::npos && paren > 0) name = name.substr(0, paren);
  if (auto at = name.find('@'); at != std::string_view::npos && at > 0) name = name.substr(0, at);
  while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
  return std::string(name.substr(0, 120));
}

// The function of one frame line ("#3  0x00007f... name" from eu-stack, "#3  0x... in name (...)
// at f.c:1" or "#0  name (...)" from gdb); "" for an address without a name or "??".
std::string frameName(std::string_view line) {
  size_t at = line.find_first_not_of("0123456789", 1);
  if (at == std::string_view::npos) return "";
  line.remove_prefix(at);
  while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
  if (startsWith(line, "0x")) {
    size_t end = line.find(' ');
    line = end == std::string_view::npos ? std::string_view() : line.substr(end + 1);
    if (startsWith(line, "in ")) line.remove_prefix(3);
  }
  std::string name = shortName(line);
  // A name goes into the summary: a tool's odd bytes do not.
  const bool printable = std::all_of(name.begin(), name.end(), [](unsigned char c) { return c >= 0x20 && c < 0x7f; });
  return name == "??" || !printable ? "" : name;
}

// The lines of the main thread's block, or nullopt when the stack has none for `pid`.
std::optional<std::vector<std::string>> mainThreadFrames(const std::string& stack, pid_t pid) {
  const std::string tid = std::to_string(pid);
  std::istringstream in(stack);
  std::string line;
  std::vector<std::string> frames;
  bool inMain = false, found = false;
  while (std::getline(in, line)) {
    const bool header = startsWith(line, "TID ") || startsWith(line, "Thread ");
    if (header) {
      inMain = line == "TID " + tid + ":" || line.find("(LWP " + tid + ")") != std::string::npos ||
               line.find("(process " + tid + ")") != std::string::npos;
      found = found || inMain;
      continue;
    }
    if (inMain && startsWith(line, "#")) frames.push_back(line);
  }
  if (!found) return std::nullopt;
  return frames;
}

// A /proc line: "thread 12 (python3): state S, waiting in futex_do_wait" or "..., running".
std::optional<RankActivity> fromProcLine(const std::string& stack, pid_t pid) {
  const std::string prefix = "thread " + std::to_string(pid) + " (";
  std::istringstream in(stack);
  std::string line;
  while (std::getline(in, line)) {
    if (!startsWith(line, prefix)) continue;
    RankActivity a;
    if (auto w = line.rfind(", waiting in "); w != std::string::npos) {
      a.where = line.substr(w + 13);
      a.activity = hasAny(a.where, kSleepChannels) ? Activity::NotWaiting : Activity::Unknown;
    } else if (line.size() >= 9 && line.compare(line.size() - 9, 9, ", running") == 0) {
      a.activity = Activity::NotWaiting;
      a.where = "running";
    }
    return a;
  }
  return std::nullopt;
}

std::string rankName(int localRank, int rankOffset) { return "rank " + std::to_string(rankOffset + localRank); }

// "waits in all_reduce #3 of world", "is in clock_nanosleep", "no stack"
std::string stateOf(const SurveyedRank& r) {
  if (!r.collective.empty()) return "waits in " + r.collective;
  const std::string where = r.activity.where.empty() ? "" : " " + r.activity.where;
  switch (r.activity.activity) {
    case Activity::Waiting: return "waits in" + where;
    case Activity::NotWaiting: return "is in" + (where.empty() ? std::string(" its own code") : where);
    case Activity::Unknown: break;
  }
  return where.empty() ? "cannot be read" : "is in" + where;
}

bool waits(const SurveyedRank& r) { return !r.collective.empty() || r.activity.activity == Activity::Waiting; }

}  // namespace

RankActivity classifyStack(const std::string& stack, pid_t pid) noexcept {
  try {
    if (auto proc = fromProcLine(stack, pid)) return *proc;
    auto frames = mainThreadFrames(stack, pid);
    if (!frames) return {};
    RankActivity a;
    std::string innermost;
    for (const std::string& line : *frames) {
      std::string name = frameName(line);
      if (name.empty()) continue;
      if (innermost.empty()) innermost = name;
      if (hasAny(name, kWaitingFrames)) return {Activity::Waiting, name};
    }
    if (!innermost.empty()) a = {Activity::NotWaiting, innermost};
    return a;
  } catch (...) {
    return {};
  }
}

Blame chooseCulprit(const std::vector<SurveyedRank>& ranks, int rankOffset, bool mayBlameWaiter) {
  // The longest silent candidate of a kind: not waiting first, then unknown, then waiting.
  const SurveyedRank* best[3] = {nullptr, nullptr, nullptr};
  for (const SurveyedRank& r : ranks) {
    if (!r.candidate) continue;
    const int kind = waits(r) ? 2 : r.activity.activity == Activity::NotWaiting ? 0 : 1;
    if (!best[kind] || r.silentFor > best[kind]->silentFor) best[kind] = &r;
  }
  const SurveyedRank* culprit = best[0] ? best[0] : best[1] ? best[1] : mayBlameWaiter ? best[2] : nullptr;
  Blame blame;
  if (!culprit) return blame;
  blame.culprit = culprit->localRank;
  const std::string name = rankName(culprit->localRank, rankOffset);
  if (culprit == best[0])
    blame.why = name + " is not waiting for its peers (its main thread " + stateOf(*culprit) + ")";
  else if (culprit == best[1])
    blame.why = name + " is not known to wait for its peers (its main thread " + stateOf(*culprit) + ")";
  else
    blame.why = "every rank of this node waits for a peer (" + name + " " + stateOf(*culprit) +
                "): the rank they wait for is on another node or never came";
  size_t named = 0, more = 0;
  for (const SurveyedRank& r : ranks) {
    if (&r == culprit) continue;
    if (named == kMaxOthersNamed) {
      ++more;
      continue;
    }
    blame.why += "; " + rankName(r.localRank, rankOffset) + " " + stateOf(r);
    ++named;
  }
  if (more) blame.why += "; and " + std::to_string(more) + " more";
  return blame;
}

}  // namespace drun::agent::detail

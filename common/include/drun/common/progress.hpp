// Progress of a long wait, said at a steady pace: nothing while the wait is short (a normal
// rendezvous takes milliseconds; a line for it would be noise), then one line after `firstAfter`
// and one every `every` after that — never a flood. The rendezvous' join, the store connect and
// the exit barrier all pace their lines with it. Value type; not thread-safe (one waiter owns it).
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "drun/common/deadline.hpp"

namespace drun {

// Where a waiting component says how its wait goes (one line, no "drun: " prefix, no newline).
// Unset: silent. Called from the waiting thread.
using ProgressSink = std::function<void(const std::string&)>;

class ProgressPacer {
 public:
  static constexpr milliseconds kFirstAfter{1000};

  explicit ProgressPacer(milliseconds every, milliseconds firstAfter = kFirstAfter)
      : started_(Clock::now()), next_(started_ + firstAfter), every_(std::max(every, milliseconds(100))) {}

  // True (once per period) when a line is due; the next one is then `every` later.
  bool due() {
    const auto now = Clock::now();
    if (now < next_) return false;
    next_ = now + every_;
    return true;
  }
  // How long a waiter may block before the next line is due (at least 1 ms).
  milliseconds untilDue() const {
    return std::max(milliseconds(1),
                    std::chrono::duration_cast<milliseconds>(next_ - Clock::now()) + milliseconds(1));
  }
  milliseconds elapsed() const {
    return std::chrono::duration_cast<milliseconds>(Clock::now() - started_);
  }

 private:
  Clock::time_point started_;
  Clock::time_point next_;
  milliseconds every_;
};

// "2h 5m", "9m 30s", "45s", "0.4s": how people read a wait.
inline std::string humanDuration(milliseconds d) {
  const long long ms = std::max<long long>(0, d.count());
  if (ms < 10000 && ms % 1000 != 0) return std::to_string(ms / 1000) + "." + std::to_string(ms % 1000 / 100) + "s";
  const long long s = ms / 1000;
  if (s < 60) return std::to_string(s) + "s";
  if (s < 3600) return std::to_string(s / 60) + "m" + (s % 60 ? " " + std::to_string(s % 60) + "s" : "");
  return std::to_string(s / 3600) + "h" + (s % 3600 / 60 ? " " + std::to_string(s % 3600 / 60) + "m" : "");
}

}  // namespace drun

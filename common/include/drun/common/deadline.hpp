// A point in time by which a blocking call must return. Every blocking call in drun takes one.
// Value type; thread-safe.
#pragma once

#include <algorithm>
#include <chrono>

namespace drun {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

class Deadline {
 public:
  explicit Deadline(milliseconds timeout) : at_(Clock::now() + timeout) {}
  static Deadline at(Clock::time_point when) { Deadline d{milliseconds(0)}; d.at_ = when; return d; }
  static Deadline never() { return at(Clock::time_point::max()); }

  Clock::time_point when() const { return at_; }
  bool expired() const { return Clock::now() >= at_; }
  // Time left, clamped at zero.
  milliseconds remaining() const {
    if (at_ == Clock::time_point::max()) return milliseconds::max();
    return std::max(milliseconds(0),
                    std::chrono::duration_cast<milliseconds>(at_ - Clock::now()));
  }

 private:
  Clock::time_point at_;
};

}  // namespace drun

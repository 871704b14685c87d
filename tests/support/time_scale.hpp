// One knob for the test harness's deadlines: DRUN_TEST_TIME_SCALE (a number, default 1) multiplies
// every deadline the harness waits on (process.hpp: run()'s and a Process's timeout, waitForOutput,
// waitForLines, wait, the leftover-process wait). Those deadlines bound hangs; on a machine or in a
// build slower than they assume (a loaded CI machine, a sanitized tree) a larger scale keeps a slow
// pass from reading as a hang. Bounds on how long something took (a test measuring a wall time)
// are not scaled: they are what the test checks.
#pragma once

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace drun::test {

// The scale from DRUN_TEST_TIME_SCALE, read once; a value that is not a number in [0.1, 100]
// throws (the test fails naming the variable) rather than being ignored.
inline double timeScale() {
  static const double scale = [] {
    const char* raw = std::getenv("DRUN_TEST_TIME_SCALE");
    if (raw == nullptr || *raw == '\0') return 1.0;
    char* end = nullptr;
    double value = std::strtod(raw, &end);
    if (end == raw || *end != '\0' || !(value >= 0.1 && value <= 100))
      throw std::invalid_argument(std::string("DRUN_TEST_TIME_SCALE='") + raw +
                                  "': expected a number from 0.1 to 100 (default 1)");
    return value;
  }();
  return scale;
}

// `timeout` times the scale.
inline std::chrono::milliseconds scaled(std::chrono::milliseconds timeout) {
  auto ms = static_cast<double>(timeout.count()) * timeScale();
  return std::chrono::milliseconds(static_cast<long long>(ms));
}

}  // namespace drun::test

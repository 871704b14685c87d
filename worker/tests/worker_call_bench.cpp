// The cost of drun's worker API calls, in ns per call: heartbeat and a section begin/end pair.
// Run it under drun (the channel mapped) and without (no-op). Prints one line per call.
#include <chrono>
#include <cstdio>

#include "drun/worker.hpp"

int main() {
  constexpr int kCalls = 10'000'000;
  drun::worker::heartbeat();  // maps the channel
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) drun::worker::heartbeat();
  auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) drun::worker::Section s("step");
  auto t2 = std::chrono::steady_clock::now();
  auto ns = [](auto d) { return std::chrono::duration<double, std::nano>(d).count() / kCalls; };
  std::printf("channel %s: heartbeat %.1f ns, section begin+end %.1f ns\n",
              drun::worker::enabled() ? "on" : "off", ns(t1 - t0), ns(t2 - t1));
  return 0;
}

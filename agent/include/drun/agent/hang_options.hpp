// HangOptions: when the agent calls a worker hung (docs/hangs.md), from --hang-timeout and
// --hang-idle. Plain aggregate with defaults; parseHangTimeout/parseHangIdle build it from the
// command line's text and throw drun::InvalidArgument with what is wrong.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace drun::agent {

struct HangOptions {
  // A rank that sent heartbeats and then none for this long is hung (--hang-timeout SECONDS).
  std::optional<std::chrono::milliseconds> silence;
  // A rank inside section NAME for longer than its timeout is hung, heartbeats or not
  // (--hang-timeout step=180,checkpoint=900).
  std::map<std::string, std::chrono::milliseconds> sections;
  // --hang-timeout auto: after `warmup` observations, `factor` x the longest interval seen
  // (between heartbeats; per section, its duration), the maximum over the node's ranks, never
  // under `learnFloor`. Kept by the agent across restarts.
  bool learn = false;
  int warmup = 10;
  double factor = 5.0;
  std::chrono::milliseconds learnFloor{1000};
  // --hang-idle SECONDS: a rank whose process group used no CPU and wrote nothing that long,
  // while another local rank finished or sits idle too, is hung (zero-code; opt-in).
  std::optional<std::chrono::milliseconds> idle;
  // How often the agent reads the channels.
  std::chrono::milliseconds pollInterval{100};
  // How long a stack capture (eu-stack, gdb, a Python worker's faulthandler) may take.
  std::chrono::milliseconds stackDeadline{5000};

  bool detects() const { return silence || !sections.empty() || learn || idle; }
};

// "SECONDS" | "NAME=SECONDS,..." (a bare SECONDS among them sets the silence timeout) | "auto"
// (durations as drun's: 30, 30s, 500ms, 2m). Section names: printable ASCII without ',' and '=',
// at most 63 bytes. Throws InvalidArgument naming --hang-timeout.
void parseHangTimeout(std::string_view text, HangOptions& into);
void parseHangIdle(std::string_view text, HangOptions& into);

// One line for logs and the summary: "no heartbeat for 5s; step=180s; learned (x5 after 10)".
std::string describe(const HangOptions& options);

}  // namespace drun::agent

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
  // --hang-timeout auto: after a warm-up of `warmup` observations spanning `warmupSpan`
  // together (a loop's first long pause, an evaluation without heartbeats, comes within it and
  // is learned), `factor` x the longest interval seen (between heartbeats; per section, its
  // duration), the maximum over the job's ranks, never under `learnFloor` (a pause longer than
  // any seen before survives that long). Kept across restarts, but forgotten after a hang that a
  // learned timeout called. --hang-timeout auto,floor=D,warmup=D sets the floor and the span.
  bool learn = false;
  int warmup = 10;
  std::chrono::milliseconds warmupSpan{60000};
  double factor = 5.0;
  std::chrono::milliseconds learnFloor{30000};
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
// with optional ",floor=D" and ",warmup=D" (durations as drun's: 30, 30s, 500ms, 2m). Section names: printable ASCII without ',' and '=',
// at most 63 bytes. Throws InvalidArgument naming --hang-timeout.
void parseHangTimeout(std::string_view text, HangOptions& into);
void parseHangIdle(std::string_view text, HangOptions& into);

// One line for logs and the summary: "no heartbeat for 5s; step=180s; learned (x5 after 10 in
// 60s, at least 30s)".
std::string describe(const HangOptions& options);

}  // namespace drun::agent

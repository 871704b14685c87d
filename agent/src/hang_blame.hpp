// Hang blame: which of the ranks that stopped making progress is the culprit. Every live local
// rank's stack is taken (stack_capture.hpp) and its main thread (the task whose tid is the pid:
// the one that runs the program) classified: waiting inside a collective or a store call (torch's
// c10d frames, Gloo, NCCL, drun's backend and libdrun_comm), doing something else (a sleep, a
// loop, I/O), or unknown (no frames, a futex without a name). The rank that is not waiting is
// blamed, with a sentence that says why: "rank 1 is not waiting for its peers (its main thread
// is in clock_nanosleep); rank 0 waits in c10d::Work::wait".
//
// Pure logic over text: no I/O, no clock (tests feed it stacks as eu-stack, gdb and /proc print
// them).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace drun::agent::detail {

enum class Activity { Waiting, NotWaiting, Unknown };

struct RankActivity {
  Activity activity = Activity::Unknown;
  std::string where;  // the frame that decided it ("c10d::Work::wait", "clock_nanosleep"), or ""
};

// Classifies the main thread (tid == pid) of a stack as eu-stack ("TID 12:" blocks), gdb ("Thread
// 1 (... (LWP 12))" blocks) or procThreadStates() ("thread 12 (comm): state S, waiting in X")
// print it. Untrusted text (a tool's output): never throws, at worst Unknown.
RankActivity classifyStack(const std::string& stack, pid_t pid) noexcept;

struct SurveyedRank {
  int localRank = 0;
  bool candidate = false;  // past its timeout (a verdict)
  std::chrono::milliseconds silentFor{0};
  std::string collective;  // what its channel says it waits in ("all_reduce #3 of world"), or ""
  RankActivity activity;   // from its stack
};

struct Blame {
  int culprit = -1;  // the local rank to blame; -1: every candidate waits, wait on (mayBlameWaiter false)
  std::string why;   // "rank 1 is not waiting ...; rank 0 waits in ..." (global ranks)
};

// The culprit among the candidates: one not waiting (the longest silent of them), else one not
// known to wait, else (only when `mayBlameWaiter`) the longest silent waiter. A rank whose
// channel names a collective waits, whatever its stack says.
Blame chooseCulprit(const std::vector<SurveyedRank>& ranks, int rankOffset, bool mayBlameWaiter);

}  // namespace drun::agent::detail

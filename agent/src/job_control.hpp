// Job control for drun's own signals: which signals drun may catch, Ctrl-Z, and the
// repeated-signal window.
//
// - A signal that was ignored when drun started stays ignored (`nohup drun ...`, or a script's
//   `drun ... &`, which a shell without job control starts with SIGINT and SIGQUIT ignored):
//   catchable() drops it.
// - Ctrl-Z (SIGTSTP, and SIGTTIN/SIGTTOU of a background drun touching the terminal): the
//   workers live in process groups of their own, which the terminal does not stop. JobControl
//   sends SIGSTOP to every worker group, stops drun itself (SIGSTOP: drun's group may be
//   orphaned, where SIGTSTP's default action does nothing), and once drun is continued (`fg`,
//   `bg`, SIGCONT) sends SIGCONT to the worker groups.
// - A second SIGINT/SIGTERM escalates to SIGKILL only when it comes kRepeatWindow after the
//   first: GNU timeout and other wrappers signal their child and then its process group, so
//   drun gets the same signal twice within a millisecond, and that must keep the grace period.
//
// Threading: JobControl's handler runs on the agent's io_context; the worker groups it stops are
// named by a callback evaluated on that loop. Ownership: owns its signal_set.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <chrono>
#include <functional>
#include <vector>

namespace drun::agent::detail {

// A second signal sooner than this after the first is the same request, not "kill now".
constexpr std::chrono::milliseconds kRepeatWindow{500};

// `wanted` without the signals whose disposition is SIG_IGN now (call before catching any).
std::vector<int> catchable(const std::vector<int>& wanted);

class JobControl {
 public:
  // `signalWorkers(sig)` sends sig to every worker's process group (nothing when none runs).
  JobControl(boost::asio::io_context& io, std::function<void(int)> signalWorkers);
  JobControl(const JobControl&) = delete;
  JobControl& operator=(const JobControl&) = delete;

 private:
  void wait();
  void suspend(int signal);
  boost::asio::signal_set stops_;
  std::function<void(int)> signalWorkers_;
};

}  // namespace drun::agent::detail

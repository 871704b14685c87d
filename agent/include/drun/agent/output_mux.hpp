// OutputMux: carries the workers' stdout/stderr to drun's console and to per-rank log files.
//
// Every worker line reaches the console whole: lines are cut at '\n', prefixed
// (OutputOptions::prefixTemplate) and handed, a batch of lines per read, to the ConsoleWriter,
// which writes them off the event loop in order (worker stdout to drun's stdout, stderr to drun's
// stderr). A line is queued as soon as it arrives. '\r' ends a segment too (progress bars redraw
// with it): each '\r'-segment is prefixed and keeps its '\r', so a bar redraws in place on a
// terminal, prefixed. A partial line (no '\n' or '\r' yet: a bar, a prompt) that waited
// OutputOptions::partialLineDelay (partialLinePipeDelay when the console is not a terminal) goes
// out as it is, prefixed; its rest follows unprefixed, or
// with a fresh prefix when another line came in between (the ConsoleWriter's LineSource rules: no
// line is ever glued to another). That one-shot timer is armed only when a read leaves a partial
// line: whole-line output costs no wakeup. At EOF a partial line gets the newline it lacked; a line
// longer than kMaxLineBytes (the most held per stream) goes out in kMaxLineBytes pieces as an open
// line: its bytes are kept, and it stays one line unless another worker's line comes between two
// pieces (then the rest continues on a fresh prefixed line). No byte is dropped or added inside
// a stream: a lone '\r' (after '\n') is passed on, so `--prefix ''` passes a single worker's
// output through exactly (except the '\n' added to an unterminated last line).
//
// Back-pressure: when the console is congested (its reader is slow or stopped), the mux stops
// reading the pipes that feed it, so the workers block on their own writes; it resumes when the
// console drains. The event loop itself never waits for the console. Pipes whose output goes to
// files only are always read, unless the log files' writer is behind: log files are written off
// the loop by one thread (log_file_writer.hpp: a stalled network file system must not stop the
// loop, and with it signal handling); once it holds 8 MiB, the pipes feeding files wait too.
// What an exited worker left in pipes paused this way is swept into the console queue (sweep(),
// and when the mux is destroyed): the queue may then exceed its bound by that much (at most a
// pipe's content per stream, or 1 MiB), and back-pressure loses nothing.
//
// Routing, per local rank and stream (torchrun's --redirects/--tee bits, 1 = stdout, 2 = stderr):
//   - attemptDir set: <attemptDir>/<local_rank>/{stdout,stderr}.log always get the raw bytes
//     (drun's --log-dir always keeps files); the console also gets the stream unless its
//     `redirect` bit is set and its `tee` bit is not (a stream in both reaches the console, as
//     with torchrun, whose tee is a redirect plus a copy to the console).
//   - attemptDir unset: console only; redirect/tee are ignored (nowhere to write).
//   - consoleLocalRanks filters the console only; files and the stderr tail get everything.
// If the console is a closed pipe (EPIPE: `drun ... | head`), the workers writing to it see what
// they would see in a shell pipeline: the mux closes the pipes (pty masters) whose stream goes to
// that console, so their next write fails (SIGPIPE, or EPIPE when ignored; EIO on a pty).
// Streams going to files only are unaffected.
//
// Threading: all on the io_context passed in (single-threaded); no exception leaves its handlers
// (one is logged as an internal error). Ownership: owns the pipe read ends handed to attach() and
// the log files; destroying it closes them. Shares the ConsoleWriter (it outlives the mux: what
// was queued is still written after the mux is gone).
#pragma once

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstddef>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "drun/agent/console_writer.hpp"
#include "drun/agent/log_rotation.hpp"

namespace drun::agent {

enum class TtyMode { Auto, Always, Never };

// Where a local rank's stdout/stderr go, torchrun's --redirects/--tee bits: 1 = stdout, 2 = stderr.
struct StdRouting {
  int redirect = 0;  // these streams go to the log file only
  int tee = 0;       // these streams go to the log file and the console
};

struct OutputOptions {
  // Console line prefix template; macros ${rank}, ${local_rank}, ${role_name}, ${hostname}.
  // Empty = no prefix. The launcher decides the default ("[${rank}]:" when >1 worker).
  std::string prefixTemplate;
  std::string roleName = "default";
  std::string hostname;
  // Local ranks whose output reaches the console; nullopt = all.
  std::optional<std::vector<int>> consoleLocalRanks;
  // Attempt directory for per-rank files: <attemptDir>/<local_rank>/{stdout,stderr}.log.
  // nullopt = no files (redirect/tee then have nowhere to write: the launcher always sets one
  // when routing is used).
  std::optional<std::filesystem::path> attemptDir;
  // --log-max-bytes / --log-max-files: every file under attemptDir rotates so.
  LogRotation logRotation;
  // Per local rank routing; ranks missing from the map use `defaultRouting`.
  StdRouting defaultRouting;
  std::map<int, StdRouting> routing;
  // How many trailing stderr lines to keep per worker for the failure summary.
  size_t stderrTailLines = 20;
  // The console: where worker stdout / stderr lines go. nullptr = ConsoleWriter::standard()
  // (drun's fds 1 and 2). Shared by every attempt's mux; tests point it at their own pipes.
  std::shared_ptr<ConsoleWriter> console;
  // How long a partial line waits for its end, its worker quiet, before it goes to the console as
  // it is: briefly when the console is a terminal (someone watches the bar or the prompt), longer
  // into a pipe or a file, whose reader parses lines: there a writer that the scheduler stalls
  // mid-line on a loaded host (tens of ms) must not have its line cut, and a bar behind
  // `| tee` still shows within a second.
  std::chrono::milliseconds partialLineDelay{50};
  std::chrono::milliseconds partialLinePipeDelay{1000};
  // Whether a worker's stdout/stderr is a pseudo-terminal of its own (isatty() true in the
  // worker) or a pipe. Auto: a pty for the streams whose console is a terminal.
  TtyMode tty = TtyMode::Auto;
  // The global rank whose stdin is drun's stdin (forwarded by the WorkerGroup); nullopt = none.
  // Every other worker's stdin is /dev/null. drun's stdin is read only while that rank runs here.
  std::optional<int> stdinRank;
  int stdinFd = 0;  // drun's stdin (tests hand a pipe of their own)
  // --duplicate-stdout-filters / --duplicate-stderr-filters: a line of any rank's stdout (stderr)
  // holding one of these substrings also goes, with the rank's console prefix, to
  // <attemptDir>/filtered_stdout.log (filtered_stderr.log). Empty: no such file.
  std::vector<std::string> duplicateStdoutFilters;
  std::vector<std::string> duplicateStderrFilters;
};

// Expands ${rank}, ${local_rank}, ${role_name}, ${hostname} in `tmpl`; other text is kept as is.
std::string expandPrefix(const std::string& tmpl, const OutputOptions& options, int localRank,
                         int globalRank);

class OutputMux {
 public:
  static constexpr size_t kMaxLineBytes = 1 << 20;   // held per stream; longer lines go in pieces
  static constexpr size_t kMaxTailLineBytes = 4096;  // stderr tail lines are truncated

  OutputMux(boost::asio::io_context& io, OutputOptions options);
  ~OutputMux();
  OutputMux(const OutputMux&) = delete;
  OutputMux& operator=(const OutputMux&) = delete;

  // Opens the rank's log files (when attemptDir is set; throws drun::Error if it cannot) and
  // returns; call before the worker starts. Idempotent per local rank.
  void prepare(int localRank, int globalRank);

  // Starts reading a worker's stdout/stderr pipe read ends (owned from now on; made non-blocking).
  // `onClosed` runs on the io_context once both reached EOF. Calls prepare() if not done yet.
  // stderrFd -1: the worker writes both streams to stdoutFd (one pipe keeps their order, when
  // the console's stdout and stderr are one destination); its stderr tail is then that pipe's.
  void attach(int localRank, int globalRank, int stdoutFd, int stderrFd,
              std::function<void()> onClosed);

  // attach() for a new worker of a local rank whose earlier worker was attached (an in-process
  // recovery's replacement): the earlier one's pipes are read to their end as before, the rank's
  // tails and closed() are the new worker's from now on, and its log files go on (appended).
  void reattach(int localRank, int globalRank, int stdoutFd, int stderrFd,
                std::function<void()> onClosed);

  // A standby worker (an in-process recovery's process started ahead of need, docs/recovery.md):
  // its output goes to the console with a prefix of its own (the template's ${rank} and
  // ${local_rank} read "standby <slot>"), to no log file, and nowhere when consoleLocalRanks is
  // set. sweep(), closed() and the tails name it standbySource(slot) until adopt().
  void attachStandby(int slot, int stdoutFd, int stderrFd, std::function<void()> onClosed);
  // The standby becomes the rank's worker (as reattach() would make a new one): the rank's
  // prefix, routing and log files (appended) from now on; its pipes, tails and onClosed go on.
  // Throws std::logic_error when no standby is attached in `slot`.
  void adopt(int slot, int localRank, int globalRank);
  static constexpr int standbySource(int slot) { return -1 - slot; }

  // Reads at once what the rank's pipes paused by back-pressure hold (bounded): call it when the
  // worker exited, so that its stderr tail is complete and its last lines are queued before
  // anything reports its exit. EOF is still found by the asynchronous read (onClosed never runs
  // from in here).
  void sweep(int localRank);

  // True once both pipes of the rank reached EOF.
  bool closed(int localRank) const;

  // The last OutputOptions::stderrTailLines lines the rank wrote to stderr (a snapshot).
  std::deque<std::string> stderrTail(int localRank) const;
  // The same for stdout (empty when both streams share one pipe: stderrTail() has them).
  std::deque<std::string> stdoutTail(int localRank) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace drun::agent

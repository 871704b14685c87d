// Stack capture of a hung native worker, off the loop's back: `eu-stack -p PID` (elfutils), else
// `gdb -p PID -batch` ("thread apply all bt"), else each thread's state and wchan from /proc. The
// tool runs as a child process (registered with the ChildReaper) whose output is read on the
// loop; past the deadline it is SIGKILLed and the next way is tried with the time left.
//
// Threading: start and callbacks on the io_context passed in. Ownership: a capture keeps itself
// alive (shared_ptr) until `done` ran; cancel() ends it early (`done` is then not called).
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace drun::agent::detail {

struct StackExcerpt {
  std::string how;   // "eu-stack", "gdb", "/proc wchan"
  std::string text;  // lines, at most kMaxStackLines of them
  std::string raw;   // the tool's whole output (bounded), for hang_blame's classification
};
inline constexpr size_t kMaxStackLines = 40;

class StackCapture {
 public:
  using Done = std::function<void(StackExcerpt)>;
  static std::shared_ptr<StackCapture> start(boost::asio::io_context& io, pid_t pid,
                                             std::chrono::milliseconds deadline, Done done);
  virtual ~StackCapture() = default;
  virtual void cancel() = 0;
};

// Each thread of `pid`: "thread TID (comm): state S, waiting in WCHAN". Never throws.
std::string procThreadStates(pid_t pid) noexcept;

// The first `maxLines` lines of `text`, each cut to 200 bytes and made printable; a note says
// how many were left out.
std::string excerpt(const std::string& text, size_t maxLines);

}  // namespace drun::agent::detail

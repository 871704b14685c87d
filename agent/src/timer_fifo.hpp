// TimerFifo: drun's server for torch's FileTimer (torch.distributed.elastic.timer.FileTimerClient):
// a FIFO (TORCHELASTIC_TIMER_FILE) into which workers write one JSON request per line, each at
// most PIPE_BUF bytes: {"version":1,"pid":P,"scope_id":S,"expiration_time":T,"signal":N}, a
// release with expiration_time -1. Read on the loop without blocking; every line is untrusted
// (bad lines are logged at debug and dropped; at most kMaxTimers timers are held). expired()
// returns the timers past their (wall clock) expiration time and forgets them.
//
// Threading: on the io_context passed in. Ownership: owns the FIFO (removed on destruction).
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace drun::agent::detail {

struct FileTimer {
  int64_t pid = 0;
  std::string scope;
  double expiration = 0;  // seconds since the epoch (time.time())
  int signal = 0;
};

class TimerFifo {
 public:
  static constexpr size_t kMaxTimers = 4096;
  // Creates the FIFO at `path` (mode 0600) and starts reading it. Throws drun::Error.
  TimerFifo(boost::asio::io_context& io, std::filesystem::path path);
  ~TimerFifo();
  const std::filesystem::path& path() const { return path_; }
  // The timers whose expiration passed at `nowSeconds`, removed from the set.
  std::vector<FileTimer> expired(double nowSeconds);
  void clear() { timers_.clear(); }  // a new attempt: the old workers' timers are void
  size_t size() const { return timers_.size(); }

  // One request line (without its '\n'); false (with why) when it is not a valid request.
  bool apply(const std::string& line, std::string* why);

 private:
  void read();
  void onReadable();

  std::filesystem::path path_;
  int keepOpen_ = -1;  // a writer of our own: the FIFO never reads EOF between clients
  boost::asio::posix::stream_descriptor fifo_;
  std::string partial_;
  bool skipping_ = false;  // inside a line longer than PIPE_BUF
  std::map<std::pair<int64_t, std::string>, FileTimer> timers_;
};

}  // namespace drun::agent::detail

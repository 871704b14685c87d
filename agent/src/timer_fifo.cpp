#include "timer_fifo.hpp"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "drun/common/error.hpp"
#include "handler_guard.hpp"

namespace drun::agent::detail {

namespace {
constexpr size_t kMaxScope = 256;
}

TimerFifo::TimerFifo(boost::asio::io_context& io, std::filesystem::path path)
    : path_(std::move(path)), fifo_(io) {
  ::unlink(path_.c_str());
  if (::mkfifo(path_.c_str(), 0600) != 0)
    throw Error("cannot create the timer FIFO " + path_.string() + ": " + std::strerror(errno));
  int fd = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open the timer FIFO " + path_.string() + ": " + std::strerror(errno));
  keepOpen_ = ::open(path_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  fifo_.assign(fd);
  read();
}

TimerFifo::~TimerFifo() {
  boost::system::error_code ignored;
  fifo_.close(ignored);
  if (keepOpen_ >= 0) ::close(keepOpen_);
  ::unlink(path_.c_str());
}

void TimerFifo::read() {
  fifo_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                   [this](const boost::system::error_code& ec) {
                     if (!ec) guarded("the timer FIFO", [&] { onReadable(); });
                   });
}

void TimerFifo::onReadable() {
  char buf[PIPE_BUF];
  for (;;) {
    ssize_t n = ::read(fifo_.native_handle(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EAGAIN: drained (EOF cannot happen: keepOpen_ writes)
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] != '\n') {
        if (skipping_) continue;
        if (partial_.size() >= PIPE_BUF) {
          spdlog::debug("timer FIFO: a request longer than {} bytes dropped", PIPE_BUF);
          partial_.clear();
          skipping_ = true;
          continue;
        }
        partial_ += buf[i];
        continue;
      }
      if (!skipping_) {
        std::string why;
        if (!apply(partial_, &why)) spdlog::debug("timer FIFO: request dropped: {}", why);
      }
      partial_.clear();
      skipping_ = false;
    }
  }
  read();
}

bool TimerFifo::apply(const std::string& line, std::string* why) {
  using nlohmann::json;
  json doc = json::parse(line, nullptr, /*allow_exceptions=*/false);
  auto fail = [&](const char* what) {
    if (why) *why = what;
    return false;
  };
  if (!doc.is_object()) return fail("not a JSON object");
  auto version = doc.find("version"), pid = doc.find("pid"), scope = doc.find("scope_id"),
       expiration = doc.find("expiration_time"), signal = doc.find("signal");
  if (version == doc.end() || !version->is_number_integer() || version->get<int64_t>() != 1)
    return fail("version is not 1");
  if (pid == doc.end() || !pid->is_number_integer() || pid->get<int64_t>() <= 0 || pid->get<int64_t>() > INT_MAX)
    return fail("pid is not a positive integer");
  if (scope == doc.end() || !scope->is_string() || scope->get<std::string>().size() > kMaxScope)
    return fail("scope_id is not a string of at most 256 bytes");
  if (expiration == doc.end() || !expiration->is_number() || !std::isfinite(expiration->get<double>()))
    return fail("expiration_time is not a number");
  if (signal != doc.end() && !signal->is_number_integer()) return fail("signal is not an integer");
  FileTimer t;
  t.pid = pid->get<int64_t>();
  t.scope = scope->get<std::string>();
  for (char& c : t.scope)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  t.expiration = expiration->get<double>();
  const int64_t sig = signal == doc.end() ? 0 : signal->get<int64_t>();
  t.signal = sig > 0 && sig < 65 ? static_cast<int>(sig) : 0;
  auto key = std::make_pair(t.pid, t.scope);
  if (t.expiration < 0) {
    timers_.erase(key);
    return true;
  }
  if (!timers_.count(key) && timers_.size() >= kMaxTimers) return fail("too many timers");
  timers_[key] = std::move(t);
  return true;
}

std::vector<FileTimer> TimerFifo::expired(double nowSeconds) {
  std::vector<FileTimer> out;
  for (auto it = timers_.begin(); it != timers_.end();) {
    if (it->second.expiration <= nowSeconds) {
      out.push_back(std::move(it->second));
      it = timers_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

}  // namespace drun::agent::detail

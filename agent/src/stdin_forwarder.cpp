#include "stdin_forwarder.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/buffer.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>

#include "handler_guard.hpp"

namespace drun::agent::detail {

namespace asio = boost::asio;

namespace {
constexpr size_t kChunkBytes = 64 * 1024;
}  // namespace

struct StdinForwarder::Impl : std::enable_shared_from_this<Impl> {
  enum class Kind { Readiness, Socket, File };

  Impl(asio::io_context& io, int sourceFd, int targetFd) : io(io), retry(io), target(io, targetFd) {
    ::fcntl(targetFd, F_SETFL, ::fcntl(targetFd, F_GETFL) | O_NONBLOCK);  // our pipe end only
    struct stat st {};
    ::fstat(sourceFd, &st);
    terminal = ::isatty(sourceFd) == 1;
    if (S_ISSOCK(st.st_mode)) {
      kind = Kind::Socket;
      fd = sourceFd;
    } else if (terminal || S_ISFIFO(st.st_mode)) {
      kind = Kind::Readiness;
      std::string path = "/proc/self/fd/" + std::to_string(sourceFd);
      fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
      ownsFd = fd >= 0;
      if (fd < 0) {
        spdlog::warn("drun: cannot forward stdin: reopening it ({}) failed: {}; the worker reads "
                     "EOF", path, std::strerror(errno));
        eof = true;
        return;
      }
      // A read racing with a move to the background gives EIO instead of stopping drun.
      if (terminal) ::signal(SIGTTIN, SIG_IGN);
    } else {
      kind = Kind::File;  // a regular file, /dev/null: reads never block
      fd = sourceFd;
    }
    if (kind != Kind::File) source.emplace(io, fd);
  }

  ~Impl() {
    if (source) source->release();  // closed below when ours; drun's own fd stays open
    if (ownsFd) ::close(fd);
  }

  asio::io_context& io;
  asio::steady_timer retry;
  asio::posix::stream_descriptor target;
  std::optional<asio::posix::stream_descriptor> source;
  Kind kind = Kind::File;
  int fd = -1;
  bool ownsFd = false;
  bool terminal = false;
  bool eof = false;
  bool stopped = false;
  std::string chunk;  // read, not yet taken by the worker
  size_t written = 0;
  std::function<void()> onTypedLine;

  void stop() {
    stopped = true;
    boost::system::error_code ignored;
    retry.cancel();
    if (source) source->cancel(ignored);
    target.close(ignored);  // the worker reads EOF
  }

  void readMore() {
    if (stopped) return;
    if (eof) return stop();
    auto self = shared_from_this();
    if (kind == Kind::File) {
      asio::post(io, [self] { guarded("stdin forwarding", [&] { self->readNow(); }); });
    } else if (inBackground()) {
      retryLater();  // reading would stop drun (SIGTTIN)
    } else {
      source->async_wait(asio::posix::descriptor_base::wait_read,
                         [self](const boost::system::error_code& ec) {
                           if (ec || self->stopped) return;
                           guarded("stdin forwarding", [&] { self->readNow(); });
                         });
    }
  }

  // drun's terminal is its controlling terminal and another process group is in its foreground
  // (`drun ... &`). A terminal that is not drun's controlling one has no job control: read it.
  bool inBackground() const {
    if (!terminal) return false;
    pid_t foreground = ::tcgetpgrp(fd);
    return foreground >= 0 && foreground != ::getpgrp();
  }

  void retryLater() {
    retry.expires_after(kBackgroundRetry);
    retry.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) guarded("stdin forwarding", [&] { self->readMore(); });
    });
  }

  void readNow() {
    if (stopped) return;
    chunk.resize(kChunkBytes);
    ssize_t n = kind == Kind::Socket ? ::recv(fd, chunk.data(), chunk.size(), MSG_DONTWAIT)
                                     : ::read(fd, chunk.data(), chunk.size());
    int error = errno;
    chunk.resize(n > 0 ? static_cast<size_t>(n) : 0);
    if (n > 0) {
      written = 0;
      if (terminal && onTypedLine && chunk.back() == '\n') onTypedLine();
      return writeMore();
    }
    if (n == 0) {
      eof = true;  // the worker reads EOF too
      return stop();
    }
    if (error == EAGAIN || error == EWOULDBLOCK || error == EINTR) return readMore();
    if (error == EIO && terminal) return retryLater();  // moved to the background meanwhile
    spdlog::debug("stdin forwarding: reading drun's stdin failed: {}", std::strerror(error));
    eof = true;
    stop();
  }

  void writeMore() {
    target.async_write_some(
        asio::buffer(chunk.data() + written, chunk.size() - written),
        [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
          if (self->stopped) return;
          guarded("stdin forwarding", [&] {
            if (ec) {
              // EPIPE: the worker closed its stdin or died; what it did not take is dropped.
              spdlog::debug("stdin forwarding: the worker does not read any more: {}", ec.message());
              return self->stop();
            }
            self->written += n;
            if (self->written < self->chunk.size()) return self->writeMore();
            self->chunk.clear();
            self->readMore();
          });
        });
  }
};

StdinForwarder::StdinForwarder(asio::io_context& io, int sourceFd, int targetFd,
                               std::function<void()> onTypedLine)
    : impl_(std::make_shared<Impl>(io, sourceFd, targetFd)) {
  impl_->onTypedLine = std::move(onTypedLine);
  impl_->readMore();
}

StdinForwarder::~StdinForwarder() {
  // Handlers still queued hold the Impl; stopping makes each of them return at once.
  impl_->stop();
}

}  // namespace drun::agent::detail

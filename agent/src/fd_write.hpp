// writeAll(): the one loop that writes a whole buffer to an fd (console lanes, worker log files).
#pragma once

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

namespace drun::agent::detail {

// Writes all of [data, data+size) to `fd`, continuing partial writes; EINTR is retried, EAGAIN (a
// non-blocking fd handed to us) waits for POLLOUT. Blocks as long as the reader does: call it only
// where blocking is allowed (a console lane's thread, a regular file). Returns 0 or the errno that
// stopped it.
inline int writeAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, -1) < 0 && errno != EINTR) return errno;
      continue;
    }
    return n < 0 ? errno : EIO;
  }
  return 0;
}

}  // namespace drun::agent::detail

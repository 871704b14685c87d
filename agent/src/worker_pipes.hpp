// Pipe: a worker's stdio channel for WorkerGroup, a pipe or a pseudo-terminal (read = master,
// write = slave), both ends close-on-exec; owns its fds until released.
#pragma once

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "drun/common/error.hpp"
#include "pty.hpp"

namespace drun::agent::detail {

struct Pipe {
  int read = -1;
  int write = -1;
  Pipe() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
      throw Error(std::string("pipe2 failed: ") + std::strerror(errno));
    read = fds[0];
    write = fds[1];
  }
  // A pty when `tty` and the system gives one, else a pipe.
  static Pipe output(bool tty, const std::optional<winsize>& size) {
    if (tty) {
      if (auto pty = openPty(size)) return Pipe(pty->master, pty->slave);
      spdlog::debug("no pseudo-terminal for a worker ({}): a pipe instead", std::strerror(errno));
    }
    return Pipe();
  }
  struct Closed {};
  explicit Pipe(Closed) {}  // no fds (yet)
  Pipe& operator=(Pipe&& other) noexcept {
    if (this != &other) {
      closeRead();
      closeWrite();
      read = std::exchange(other.read, -1);
      write = std::exchange(other.write, -1);
    }
    return *this;
  }
  Pipe(Pipe&& other) noexcept
      : read(std::exchange(other.read, -1)), write(std::exchange(other.write, -1)) {}
  ~Pipe() {
    closeRead();
    closeWrite();
  }
  int releaseRead() { return std::exchange(read, -1); }
  int releaseWrite() { return std::exchange(write, -1); }
  void closeRead() {
    if (read >= 0) ::close(std::exchange(read, -1));
  }
  void closeWrite() {
    if (write >= 0) ::close(std::exchange(write, -1));
  }

 private:
  Pipe(int r, int w) : read(r), write(w) {}
};

}  // namespace drun::agent::detail

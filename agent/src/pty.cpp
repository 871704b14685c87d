#include "pty.hpp"

#include <fcntl.h>
#include <stdlib.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>

namespace drun::agent::detail {

std::optional<PtyPair> openPty(const std::optional<winsize>& size) {
  int master = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) return std::nullopt;
  auto fail = [&](int slave) -> std::optional<PtyPair> {
    int saved = errno;
    if (slave >= 0) ::close(slave);
    ::close(master);
    errno = saved;
    return std::nullopt;
  };
  char name[128];
  if (::grantpt(master) != 0 || ::unlockpt(master) != 0 || ::ptsname_r(master, name, sizeof name) != 0)
    return fail(-1);
  int slave = ::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (slave < 0) return fail(-1);
  termios tio;
  if (::tcgetattr(slave, &tio) != 0) return fail(slave);
  tio.c_oflag &= ~static_cast<tcflag_t>(ONLCR);  // "\n" stays "\n": no "\r\n" in the console
  tio.c_lflag &= ~static_cast<tcflag_t>(ECHO | ECHONL);
  if (::tcsetattr(slave, TCSANOW, &tio) != 0) return fail(slave);
  if (size) ::ioctl(slave, TIOCSWINSZ, &*size);  // best effort: a 0x0 pty still works
  return PtyPair{master, slave};
}

std::optional<winsize> terminalSize(int fd) {
  winsize ws{};
  if (::ioctl(fd, TIOCGWINSZ, &ws) != 0 || (ws.ws_row == 0 && ws.ws_col == 0)) return std::nullopt;
  return ws;
}

}  // namespace drun::agent::detail

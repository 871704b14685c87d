// Pseudo-terminals for workers whose console is a terminal: the worker's stdout (or stderr) is
// the slave side, so isatty() is true in the worker (colours, Python's line buffering, progress
// bars behave as in the user's shell); drun reads the master side like a pipe.
//
// The slave's line discipline is set so that bytes pass through as written: no ONLCR (a "\n"
// stays "\n", lines stay clean when multiplexed), no ECHO (nothing is typed into it). Reading the
// master after every slave fd closed gives EIO: that is the pipe's EOF.
//
// The pty is NOT made the worker's controlling terminal (no setsid + TIOCSCTTY): the worker stays
// in drun's session, so /dev/tty is still the user's terminal (getpass() prompts work as under
// torchrun), the job's process-group bookkeeping is unchanged, and no hangup signal depends on
// it. Window-size changes are forwarded by drun itself (SIGWINCH to the worker's group).
//
// Threading: plain functions, any thread. Ownership: the caller owns the returned fds.
#pragma once

#include <sys/ioctl.h>

#include <optional>

namespace drun::agent::detail {

struct PtyPair {
  int master = -1;  // drun's end (O_CLOEXEC)
  int slave = -1;   // the worker's stdout/stderr (O_CLOEXEC; dup2'd into the worker)
};

// Opens a pseudo-terminal pair with the termios above and window size `size` (when given).
// Returns nullopt with errno set when the system has none to give (no /dev/pts, limit reached):
// the caller falls back to a pipe.
std::optional<PtyPair> openPty(const std::optional<winsize>& size);

// The window size of terminal `fd`, nullopt when it is not a terminal (or reports 0x0).
std::optional<winsize> terminalSize(int fd);

}  // namespace drun::agent::detail

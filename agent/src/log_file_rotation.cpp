#include "log_file_rotation.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace drun::agent::detail {
namespace {

std::string rotatedName(const std::string& name, int index) { return name + "." + std::to_string(index); }

// rename(2), a missing source being no error (fewer rotations so far than kept files).
int renameIfThere(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) == 0 || errno == ENOENT) return 0;
  return errno;
}

}  // namespace

int rotateLogFile(const std::string& name, int keep, int& fd) {
  if (keep <= 0) return ::ftruncate(fd, 0) == 0 ? 0 : errno;  // O_APPEND: the next write is at 0
  if (::unlink(rotatedName(name, keep).c_str()) != 0 && errno != ENOENT) return errno;
  for (int i = keep - 1; i >= 1; --i)
    if (const int error = renameIfThere(rotatedName(name, i), rotatedName(name, i + 1))) return error;
  if (std::rename(name.c_str(), rotatedName(name, 1).c_str()) != 0) return errno;
  const int fresh = ::open(name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fresh < 0) return errno;
  ::close(fd);
  fd = fresh;
  return 0;
}

}  // namespace drun::agent::detail

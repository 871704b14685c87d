#include "temp_dirs.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace drun::agent::detail {

namespace fs = std::filesystem;

namespace {

// mkdtemp's name for drun's stem: "drun_" and six characters.
bool isTempDirName(const std::string& name) {
  return name.size() == 11 && name.compare(0, 5, "drun_") == 0 &&
         name.find_first_of("/.", 5) == std::string::npos;
}

// Nothing but directories below `dir` (bounded depth: drun's tree is 3 levels deep).
bool onlyEmptyDirectories(const fs::path& dir, int depth = 0) {
  std::error_code ec;
  if (depth > 4) return false;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_directory(ec) || it->is_symlink(ec)) return false;
    if (!onlyEmptyDirectories(it->path(), depth + 1)) return false;
  }
  return !ec;
}

}  // namespace

int lockTempDir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

int removeAbandonedTempDirs(const fs::path& parent, std::chrono::seconds quietFor) {
  int removed = 0;
  std::error_code ec;
  const uid_t me = ::getuid();
  const auto now = std::chrono::system_clock::now();
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    struct stat st {};
    if (!isTempDirName(name) || ::lstat(it->path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != me)
      continue;
    const auto modified = std::chrono::system_clock::from_time_t(st.st_mtime);
    if (now - modified < quietFor) continue;  // maybe a drun that has not locked it yet
    int lock = lockTempDir(it->path());
    if (lock < 0) continue;  // a running drun's
    if (onlyEmptyDirectories(it->path())) {
      std::error_code gone;
      fs::remove_all(it->path(), gone);
      if (!gone) ++removed;
    }
    ::close(lock);
  }
  if (removed) spdlog::debug("agent: removed {} abandoned temporary job tree(s) under {}", removed, parent.string());
  return removed;
}

}  // namespace drun::agent::detail

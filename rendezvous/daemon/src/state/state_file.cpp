#include "state_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "drun/common/error.hpp"

namespace drun::rdzv::state {
namespace {

// "<what>: <the error's text>", e.g. "/var/lib/drun/state.json.tmp: fsync: No space left on device".
[[noreturn]] void fail(const std::string& what, int error) {
  throw Error(what + ": " + std::strerror(error));
}

// Closes the descriptor when it goes out of scope.
struct Descriptor {
  int fd = -1;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

void writeAll(int fd, const std::string& text, const std::filesystem::path& file) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(file.string() + ": write", errno);
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void writeStateFile(const std::filesystem::path& file, const std::string& text) {
  const std::filesystem::path tmp = file.string() + ".tmp";
  {
    Descriptor out{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)};
    if (out.fd < 0) fail(tmp.string() + ": open", errno);
    writeAll(out.fd, text, tmp);
    if (::fsync(out.fd) != 0) fail(tmp.string() + ": fsync", errno);
  }
  if (::rename(tmp.c_str(), file.c_str()) != 0) fail(file.string() + ": rename from " + tmp.string(), errno);
  const std::filesystem::path dir = file.has_parent_path() ? file.parent_path() : ".";
  Descriptor directory{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (directory.fd < 0) fail(dir.string() + ": open", errno);
  if (::fsync(directory.fd) != 0) fail(dir.string() + ": fsync", errno);
}

std::optional<std::string> readStateFile(const std::filesystem::path& file, size_t maxBytes) {
  Descriptor in{::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (in.fd < 0 && errno == ENOENT) return std::nullopt;
  if (in.fd < 0) fail("open", errno);
  struct stat info {};
  if (::fstat(in.fd, &info) != 0) fail("stat", errno);
  if (!S_ISREG(info.st_mode)) throw InvalidArgument("not a regular file");
  if (static_cast<uint64_t>(info.st_size) > maxBytes)
    throw InvalidArgument(std::to_string(info.st_size) + " bytes, more than the " +
                          std::to_string(maxBytes) + " kept");
  std::string text;
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::read(in.fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("read", errno);
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
    if (text.size() > maxBytes) throw InvalidArgument("more than the " + std::to_string(maxBytes) + " bytes kept");
  }
  return text;
}

std::filesystem::path moveAside(const std::filesystem::path& file) {
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  const std::filesystem::path aside = file.string() + ".bad-" + std::to_string(seconds);
  if (::rename(file.c_str(), aside.c_str()) != 0) fail("rename to " + aside.string(), errno);
  return aside;
}

}  // namespace drun::rdzv::state

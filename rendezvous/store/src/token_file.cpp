#include "drun/store/token_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "drun/common/env.hpp"
#include "drun/common/error.hpp"

namespace drun::rdzv {

std::string readTokenFile(const std::string& path, const std::string& what) {
  const std::string where = what + " " + path;
  // O_NONBLOCK: a FIFO given by mistake must not hang the open; fstat then refuses it.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) throw InvalidArgument(where + ": cannot open: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw InvalidArgument(where + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw InvalidArgument(where + ": not a regular file");
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    throw InvalidArgument(where + ": its group or others may access it (mode " + mode +
                          "); the token is a secret: chmod 600 " + path);
  }
  if (st.st_size > static_cast<off_t>(kMaxTokenBytes + 1))
    throw InvalidArgument(where + ": " + std::to_string(st.st_size) + " bytes, more than a token (" +
                          std::to_string(kMaxTokenBytes) + " at most)");
  std::string token(kMaxTokenBytes + 2, '\0');
  size_t got = 0;
  while (got < token.size()) {
    ssize_t n = ::read(fd, token.data() + got, token.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw InvalidArgument(where + ": read: " + std::strerror(errno));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  token.resize(got);
  if (!token.empty() && token.back() == '\n') token.pop_back();
  if (!token.empty() && token.back() == '\r') token.pop_back();
  if (token.size() < kMinTokenBytes || token.size() > kMaxTokenBytes)
    throw InvalidArgument(where + ": a token is " + std::to_string(kMinTokenBytes) + " to " +
                          std::to_string(kMaxTokenBytes) + " bytes, this one " +
                          std::to_string(token.size()) +
                          " (make one with: head -c 32 /dev/urandom | base64 > FILE)");
  return token;
}

std::string tokenFromEnvironment() {
  const std::string path = env::getString("DRUN_RDZV_TOKEN_FILE");
  return path.empty() ? "" : readTokenFile(path, "DRUN_RDZV_TOKEN_FILE");
}

}  // namespace drun::rdzv

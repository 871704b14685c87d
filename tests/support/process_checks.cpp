// What the end-to-end tests look at around the processes they run (see process.hpp): paths,
// temporary directories, leftover processes, drun's console and the env_dump helper's output.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "process.hpp"

namespace drun::test {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::string readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

// ---- paths -------------------------------------------------------------------------------------

fs::path buildDir() {
  const char* dir = std::getenv("DRUN_BUILD_DIR");
  if (!dir || !*dir)
    throw std::runtime_error("DRUN_BUILD_DIR is not set (run the e2e tests through ctest)");
  return fs::path(dir);
}

fs::path drunPath() { return buildDir() / "bin" / "drun"; }

fs::path helperPath(const std::string& name) { return buildDir() / "tests" / "helpers" / name; }

TempDir::TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "drun-e2e-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw std::system_error(errno, std::generic_category(), "mkdtemp");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

fs::path TempDir::write(const std::string& name, const std::string& content, fs::perms mode) {
  fs::path p = path_ / name;
  fs::create_directories(p.parent_path());
  {
    std::ofstream f(p, std::ios::binary | std::ios::trunc);
    f << content;
  }
  fs::permissions(p, mode);
  return p;
}

// ---- leftover processes ------------------------------------------------------------------------

std::vector<pid_t> processesWithEnv(const std::string& needle) {
  std::vector<pid_t> found;
  pid_t self = ::getpid();
  DIR* proc = ::opendir("/proc");
  if (!proc) return found;
  while (dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == self) continue;
    fs::path dir = fs::path("/proc") / entry->d_name;
    std::string stat = readFile(dir / "stat");
    auto close = stat.rfind(')');
    if (close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] == 'Z' ||
        stat[close + 2] == 'X')
      continue;  // gone, or a zombie (it has no environment and cannot do anything)
    std::string environ = readFile(dir / "environ");
    size_t start = 0;
    while (start < environ.size()) {
      size_t end0 = environ.find('\0', start);
      if (end0 == std::string::npos) end0 = environ.size();
      if (environ.compare(start, end0 - start, needle) == 0) {
        found.push_back(static_cast<pid_t>(pid));
        break;
      }
      start = end0 + 1;
    }
  }
  ::closedir(proc);
  return found;
}

std::vector<pid_t> waitNoProcessesWithEnv(const std::string& needle,
                                          std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + scaled(timeout);
  while (true) {
    auto pids = processesWithEnv(needle);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (pids.empty() || left <= 0ms) return pids;
    // Sleep until one of them exits, but rescan at least every 50 ms: new ones may appear.
    std::vector<pollfd> fds;
    for (pid_t p : pids) {
      int fd = pidfdOpen(p);
      if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    }
    if (!fds.empty())
      ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(50, left.count())));
    for (auto& f : fds) ::close(f.fd);
  }
}

MarkerScope::MarkerScope() : value_(randomHex(20)) {}

MarkerScope::~MarkerScope() {
  // Whatever still carries our marker was started by this test (through drun): kill it by PID.
  for (int round = 0; round < 5; ++round) {
    auto pids = processesWithEnv(env());
    if (pids.empty()) return;
    for (pid_t p : pids) ::kill(p, SIGKILL);
    waitNoProcessesWithEnv(env(), 1s);
  }
}

std::string MarkerScope::describe(const std::vector<pid_t>& pids) {
  std::ostringstream ss;
  for (pid_t p : pids) {
    fs::path dir = fs::path("/proc") / std::to_string(p);
    std::string cmdline = readFile(dir / "cmdline");
    for (char& c : cmdline)
      if (c == '\0') c = ' ';
    std::string stat = readFile(dir / "stat");
    auto close = stat.rfind(')');
    char state = close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
    ss << "  pid " << p << " state " << state << ": " << cmdline << "\n";
  }
  return ss.str();
}

// ---- output parsing ----------------------------------------------------------------------------

int countLinesWith(const std::string& text, const std::string& needle) {
  int n = 0;
  for (const std::string& line : splitLines(text)) n += line.find(needle) != std::string::npos;
  return n;
}

std::vector<std::string> splitLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) {
      lines.push_back(text.substr(start));
      break;
    }
    lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return lines;
}

std::vector<ConsoleLine> parseConsole(const std::string& output) {
  std::vector<ConsoleLine> result;
  for (auto& line : splitLines(output)) {
    ConsoleLine parsed;
    size_t close = line.find("]:");
    bool prefixed = !line.empty() && line[0] == '[' && close != std::string::npos && close > 1 &&
                    line.find_first_not_of("0123456789", 1) == close;
    if (prefixed) {
      parsed.rank = std::stoi(line.substr(1, close - 1));
      parsed.text = line.substr(close + 2);
    } else {
      parsed.text = line;
    }
    result.push_back(std::move(parsed));
  }
  return result;
}

std::string randomHex(size_t chars) {
  static thread_local std::mt19937_64 rng{std::random_device{}() ^
                                          static_cast<uint64_t>(::getpid()) << 32};
  static const char kHex[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < chars; ++i) s.push_back(kHex[rng() % 16]);
  return s;
}

}  // namespace drun::test

namespace drun::test {

RunOptions drunCommand(std::vector<std::string> args, std::vector<std::string> env,
                       std::chrono::milliseconds timeout) {
  RunOptions options;
  options.argv.push_back(drunPath().string());
  for (auto& a : args) options.argv.push_back(std::move(a));
  options.env = std::move(env);
  options.timeout = timeout;
  return options;
}

std::optional<std::string> EnvDump::get(const std::string& key) const {
  for (const auto& [k, v] : vars)
    if (k == key) return v;
  return std::nullopt;
}

size_t EnvDump::count(const std::string& key) const {
  size_t n = 0;
  for (const auto& [k, v] : vars) n += k == key;
  return n;
}

std::map<int, EnvDump> parseEnvDumps(const std::string& output) {
  std::map<int, EnvDump> dumps;
  for (const auto& line : parseConsole(output)) {
    const std::string& t = line.text;
    if (t.rfind("env:", 0) == 0) {
      size_t eq = t.find('=');
      if (eq == std::string::npos) continue;
      dumps[line.rank].vars.emplace_back(t.substr(4, eq - 4), t.substr(eq + 1));
    } else if (t.rfind("arg:", 0) == 0) {
      size_t eq = t.find('=');
      if (eq == std::string::npos) continue;
      dumps[line.rank].args.push_back(t.substr(eq + 1));
    }
  }
  return dumps;
}

std::string hostName() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace drun::test

namespace drun::test {

// Drawn at random from [10000, 20000) less the kernel's ephemeral range, and checked by a bind
// without SO_REUSEADDR: a port the kernel hands out itself (bind to 0, or a connect's local port,
// which tests running beside this one make all the time) could be taken again between this check
// and the caller's bind; one outside that range is taken only by a program that names it. Below
// drun's own draws (MASTER_PORT from 28000 up, SLURM's rendezvous ports 20000..27999).
uint16_t freeLoopbackPort() {
  int ephemeralFirst = 32768, ephemeralLast = 60999;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range)
    range >> ephemeralFirst >> ephemeralLast;
  static std::mt19937 draw(std::random_device{}());
  std::uniform_int_distribution<int> pick(10000, 19999);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = pick(draw);
    if (port >= ephemeralFirst && port <= ephemeralLast) continue;
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error("socket: " + std::string(std::strerror(errno)));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (free) return static_cast<uint16_t>(port);
  }
  throw std::runtime_error("no free loopback port in 10000..19999 after 1000 draws");
}

}  // namespace drun::test

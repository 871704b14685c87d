// behave: a scriptable worker for the launcher's end-to-end tests. Each argument is one step, run in
// order. A step may end in conditions, "@rank=1,2", "@rank!=0" or "@restart=0,1" (RANK and
// TORCHELASTIC_RESTART_COUNT), and is skipped when they do not hold. In step arguments, {rank},
// {local_rank} and {restart} are replaced by this worker's values.
//
//   out:TEXT          TEXT + '\n' to stdout          err:TEXT     the same to stderr
//   outraw:TEXT       TEXT to stdout, no '\n' (e.g. a last line without one)
//   env:KEY           "KEY=<value>" (or "KEY unset") to stdout
//   ready             "READY rank=<r> restart=<k> pid=<pid>" to stdout
//   sleep:MS          sleep MS milliseconds (every helper dies by SIGALRM after 180 s anyway)
//   exit:CODE         exit with CODE
//   raise:SIG         die by signal SIG (SEGV, ABRT, KILL, ...; no core file)
//   ignore:SIG        ignore SIG (e.g. TERM) from now on
//   grandchild        fork a child that calls setsid(), closes stdio and sleeps; waits until the
//                     child is in its new session. grandchild:stubborn also ignores TERM/INT/HUP.
//   errorfile:MSG     write torch's @record JSON for MSG to $TORCHELASTIC_ERROR_FILE
//   errorfile-plain:MSG   the same as {"message": "MSG"}
//   touch:PATH        create PATH          append:PATH   append "rank=<r> restart=<k>\n" to PATH
//   await:PATH        wait until PATH exists (inotify, bounded: 60 s, then exit 98); with touch,
//                     orders steps across workers (e.g. rank 1 fails only once rank 0 is ready)
//   bind-master       bind and listen on MASTER_ADDR's host, port MASTER_PORT, *without*
//                     SO_REUSEADDR (as a plain program would); prints "BOUND <port>" or exits 96
//   gate:FIFO         open FIFO (made by the test) for reading, print READY (as above), then wait
//                     until a writer has opened and closed it (bounded: 60 s, then exit 98)
//
// Writes use one write(2) per line. An unknown step exits 97 with a message on stderr.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

std::string envOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

const std::string kRank = envOr("RANK", "-1");
const std::string kLocalRank = envOr("LOCAL_RANK", "-1");
const std::string kRestart = envOr("TORCHELASTIC_RESTART_COUNT", "0");

void writeAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

[[noreturn]] void fail(const std::string& why) {
  writeAll(2, "behave: " + why + "\n");
  std::_Exit(97);
}

std::string substitute(std::string text) {
  const std::pair<const char*, const std::string*> macros[] = {
      {"{rank}", &kRank}, {"{local_rank}", &kLocalRank}, {"{restart}", &kRestart}};
  for (auto [macro, value] : macros)
    for (size_t pos; (pos = text.find(macro)) != std::string::npos;)
      text.replace(pos, std::strlen(macro), *value);
  return text;
}

int signalNumber(std::string name) {
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  static const std::map<std::string, int> kSignals = {
      {"SEGV", SIGSEGV}, {"ABRT", SIGABRT}, {"KILL", SIGKILL}, {"TERM", SIGTERM},
      {"INT", SIGINT},   {"HUP", SIGHUP},   {"QUIT", SIGQUIT}, {"USR1", SIGUSR1},
      {"BUS", SIGBUS},   {"FPE", SIGFPE}};
  auto it = kSignals.find(name);
  if (it == kSignals.end()) fail("unknown signal " + name);
  return it->second;
}

// Step conditions: "@rank=1,2", "@rank!=0", "@restart=0,1". All must hold.
bool conditionsHold(std::string& step) {
  bool hold = true;
  for (size_t at; (at = step.rfind('@')) != std::string::npos;) {
    std::string cond = step.substr(at + 1);
    step.resize(at);
    bool negate = false;
    size_t eq = cond.find("!=");
    if (eq != std::string::npos) {
      negate = true;
    } else {
      eq = cond.find('=');
    }
    if (eq == std::string::npos) fail("bad condition @" + cond);
    std::string key = cond.substr(0, eq);
    std::string values = cond.substr(eq + (negate ? 2 : 1));
    const std::string* actual = key == "rank" ? &kRank : key == "restart" ? &kRestart : nullptr;
    if (!actual) fail("bad condition key " + key);
    bool listed = false;
    std::stringstream ss(values);
    for (std::string v; std::getline(ss, v, ',');) listed = listed || v == *actual;
    hold = hold && (listed != negate);
  }
  return hold;
}

void printReady() {
  writeAll(1, "READY rank=" + kRank + " restart=" + kRestart + " pid=" + std::to_string(::getpid()) +
                  "\n");
}

std::string jsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out.push_back(c);
  }
  return out;
}

void writeErrorFile(const std::string& json) {
  const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (!path || !*path) fail("TORCHELASTIC_ERROR_FILE is not set");
  int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(std::string("cannot write error file ") + path + ": " + std::strerror(errno));
  writeAll(fd, json);
  ::close(fd);
}

void spawnGrandchild(bool stubborn) {
  int ready[2];
  if (::pipe(ready) != 0) fail("pipe");
  pid_t pid = ::fork();
  if (pid < 0) fail("fork");
  if (pid == 0) {
    ::close(ready[0]);
    ::alarm(180);
    if (::setsid() < 0) std::_Exit(96);
    if (stubborn)
      for (int s : {SIGTERM, SIGINT, SIGHUP}) ::signal(s, SIG_IGN);
    int devnull = ::open("/dev/null", O_RDWR);
    for (int fd : {0, 1, 2}) ::dup2(devnull, fd);
    writeAll(ready[1], "x");
    ::close(ready[1]);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char c;
  while (::read(ready[0], &c, 1) < 0 && errno == EINTR) {
  }
  ::close(ready[0]);
}

void gate(const std::string& fifo) {
  // Opened before READY is printed, so the test's writer (opened after it saw READY) is seen:
  // POLLHUP is reported only once a writer has come and gone since this open.
  int fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail("cannot open fifo " + fifo + ": " + std::strerror(errno));
  printReady();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) std::_Exit(98);
    pollfd p{fd, POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc > 0 && (p.revents & POLLHUP)) break;
    if (rc > 0 && (p.revents & POLLIN)) {
      char buf[64];
      if (::read(fd, buf, sizeof buf) == 0) break;
    }
  }
  ::close(fd);
}

void await(const std::string& path) {
  std::string dir = path.substr(0, path.find_last_of('/') + 1);
  int fd = ::inotify_init1(IN_CLOEXEC);
  if (fd < 0 || ::inotify_add_watch(fd, dir.empty() ? "." : dir.c_str(), IN_CREATE | IN_MOVED_TO) < 0)
    fail("cannot watch " + dir + ": " + std::strerror(errno));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  // Watch first, then look: a file created in between is seen either way.
  while (::access(path.c_str(), F_OK) != 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) std::_Exit(98);
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) > 0) {
      char events[4096];
      (void)!::read(fd, events, sizeof events);
    }
  }
  ::close(fd);
}

void bindMaster() {
  const char* port = std::getenv("MASTER_PORT");
  if (!port) fail("MASTER_PORT unset");
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::atoi(port)));
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 1) != 0) {
    writeAll(2, std::string("bind MASTER_PORT ") + port + ": " + std::strerror(errno) + "\n");
    std::_Exit(96);
  }
  writeAll(1, std::string("BOUND ") + port + "\n");
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  ::alarm(180);  // no helper outlives a broken test by long
  for (int i = 1; i < argc; ++i) {
    std::string step = argv[i];
    if (!conditionsHold(step)) continue;
    size_t colon = step.find(':');
    std::string name = step.substr(0, colon);
    std::string arg = colon == std::string::npos ? "" : substitute(step.substr(colon + 1));

    if (name == "out") {
      writeAll(1, arg + "\n");
    } else if (name == "outraw") {
      writeAll(1, arg);
    } else if (name == "err") {
      writeAll(2, arg + "\n");
    } else if (name == "env") {
      const char* v = std::getenv(arg.c_str());
      writeAll(1, v ? arg + "=" + v + "\n" : arg + " unset\n");
    } else if (name == "ready") {
      printReady();
    } else if (name == "sleep") {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atol(arg.c_str())));
    } else if (name == "exit") {
      std::_Exit(std::atoi(arg.c_str()));
    } else if (name == "raise") {
      int sig = signalNumber(arg);
      rlimit noCore{0, 0};
      ::setrlimit(RLIMIT_CORE, &noCore);
      ::signal(sig, SIG_DFL);
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, sig);
      ::sigprocmask(SIG_UNBLOCK, &set, nullptr);
      ::raise(sig);
      fail("survived raise(" + arg + ")");
    } else if (name == "ignore") {
      ::signal(signalNumber(arg), SIG_IGN);
    } else if (name == "grandchild") {
      spawnGrandchild(arg == "stubborn");
    } else if (name == "errorfile") {
      writeErrorFile(R"({"message": {"message": ")" + jsonEscape(arg) +
                     R"(", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"train.py\", line 1\n)" +
                     jsonEscape(arg) + R"(\n", "timestamp": ")" + std::to_string(std::time(nullptr)) +
                     "\"}}}");
    } else if (name == "errorfile-plain") {
      writeErrorFile(R"({"message": ")" + jsonEscape(arg) + "\"}");
    } else if (name == "touch") {
      int fd = ::open(arg.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) fail("cannot create " + arg);
      ::close(fd);
    } else if (name == "append") {
      int fd = ::open(arg.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd < 0) fail("cannot open " + arg);
      writeAll(fd, "rank=" + kRank + " restart=" + kRestart + "\n");
      ::close(fd);
    } else if (name == "await") {
      await(arg);
    } else if (name == "gate") {
      gate(arg);
    } else if (name == "bind-master") {
      bindMaster();
    } else {
      fail("unknown step '" + step + "'");
    }
  }
  return 0;
}

// The torchrun compatibility test's cases and the rules by which a drun worker's variable matches
// a torchrun worker's (torchrun_compat_test.cpp runs the cases): what a case is, what one launch
// of it gave, and valueMismatch(), each normalisation with its reason.
#pragma once

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "process.hpp"
#include "torch_python.hpp"

namespace drun::test::torchrun_compat {

namespace fs = std::filesystem;

// How the program is named on the command line.
enum class Form { Script, Module, NoPython };

struct CompatCase {
  std::string name;
  // torchrun 1.13 options (underscore spelling), one list per agent; {PORT} and {LOGDIR} are
  // replaced per run. The program and its arguments follow (see Form).
  std::vector<std::vector<std::string>> agents;
  Form form = Form::Script;
  std::vector<std::string> env;       // changes to the environment of both launchers
  std::vector<std::string> drunOnly;  // options torchrun 1.13 lacks: on drun's line only
  // With --local-ranks-filter: the local ranks whose lines reach drun's console.
  std::optional<std::set<int>> consoleLocalRanks;
  bool staticBackend = false;  // MASTER_ADDR/PORT come from the command line
  bool logDir = false;         // {LOGDIR} is on the line
};

// torchrun 1.13's --standalone sets a fresh uuid4 run id in every run, whatever --rdzv_id says.
inline bool standalone(const CompatCase& c) {
  for (const auto& options : c.agents)
    for (const auto& o : options)
      if (o == "--standalone") return true;
  for (const auto& e : c.env)
    if (e == "PET_STANDALONE=1") return true;
  return false;
}

enum class Launcher { Torchrun, Drun, DrunDashed };

inline std::string launcherName(Launcher l) {
  switch (l) {
    case Launcher::Torchrun: return "torchrun 1.13";
    case Launcher::Drun: return "drun";
    case Launcher::DrunDashed: return "drun (dash spelling)";
  }
  return "?";
}

// Variables drun sets that torchrun 1.13 does not (docs/options.md, "What each worker gets"):
// DRUN_JOB_TOKEN marks the job's processes; PYTHONUNBUFFERED does for Python programs what
// torchrun's `python -u` does (and reaches the program's own Python children too);
// OMP_NUM_THREADS is set for one worker too (cores / workers), where torchrun leaves it unset.
// Hangs (docs/hangs.md): DRUN_WORKER_CHANNEL (the rank's heartbeat page), PYTHONFAULTHANDLER
// (a hung Python worker's stack), PYTHONPATH (drun's Python package first), and
// TORCHELASTIC_TIMER_FILE (drun serves torch's FileTimer in every job; torchrun only with
// TORCHELASTIC_ENABLE_FILE_TIMER=1).
inline const std::set<std::string> kDrunExtras = {"DRUN_JOB_TOKEN", "PYTHONUNBUFFERED", "OMP_NUM_THREADS",
                                           "DRUN_WORKER_CHANNEL", "PYTHONFAULTHANDLER", "PYTHONPATH",
                                           "TORCHELASTIC_TIMER_FILE"};

// The directory of one launch, in the dumps' values.
inline constexpr const char* kLaunchDir = "@";

// What one launcher (or the control run) did with one case.
struct Launch {
  std::vector<RunResult> agents;
  std::map<int, std::vector<EnvDump>> dumps;  // by the RANK the worker saw (-1: none)
  std::set<std::string> console;              // "stdout hello R", "stderr oops R"
  std::set<std::string> files;                // "attempt_0/1/stdout.log: hello 1"
  fs::path logDir, tmpDir;  // "@/logs", "@/tmp"
};

// Whether two host names designate one host: equal, or their addresses (getaddrinfo) meet.
inline bool sameHost(const std::string& a, const std::string& b) {
  if (a == b) return true;
  auto addresses = [](const std::string& host) {
    std::set<std::string> out;
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
    for (addrinfo* p = res; p; p = p->ai_next) {
      char buf[INET6_ADDRSTRLEN] = {};
      const void* at =
          p->ai_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(p->ai_addr)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(p->ai_addr)->sin6_addr);
      if (::inet_ntop(p->ai_family, at, buf, sizeof buf)) out.insert(buf);
    }
    ::freeaddrinfo(res);
    return out;
  };
  auto left = addresses(a), right = addresses(b);
  for (const auto& x : left)
    if (right.count(x)) return true;
  return false;
}

inline bool isPort(const std::string& v) {
  return !v.empty() && v.size() <= 5 && v.find_first_not_of("0123456789") == std::string::npos &&
         std::stoi(v) >= 1 && std::stoi(v) <= 65535;
}

inline bool isCount(const std::string& v) {
  return !v.empty() && v.size() < 6 && v.find_first_not_of("0123456789") == std::string::npos;
}

inline bool isPositiveInt(const std::string& v) { return isCount(v) && std::stoi(v) >= 1; }

inline bool under(const std::string& path, const fs::path& dir) {
  std::string d = dir.string();
  return path.rfind(d + "/", 0) == 0;
}

// "" when torchrun's value `t` and drun's `d` of `key` mean the same, else why not. `tl`/`dl`:
// the launches (for their own temporary and log directories); `w`: the drun worker's dump.
inline std::string valueMismatch(const CompatCase& c, const std::string& key, const std::string& t,
                          const std::string& d, const Launch& tl, const Launch& dl,
                          const EnvDump& w) {
  auto differ = [&] { return "torchrun '" + t + "', drun '" + d + "'"; };
  if (key == "MASTER_PORT" && !c.staticBackend) {
    // c10d: the rank-0 agent picks a free port in every run (round) of either launcher.
    return isPort(t) && isPort(d) ? "" : differ();
  }
  if (key == "MASTER_ADDR" && !c.staticBackend) {
    // c10d: torchrun 1.13 names node rank 0's host by socket.getfqdn(), drun by an address of
    // it (127.0.0.1 on a single-node job): both must designate the same host.
    return sameHost(t, d) ? "" : differ() + " (not the same host)";
  }
  if (key == "TORCHELASTIC_RUN_ID" && standalone(c)) {
    // --standalone: torchrun 1.13 draws a uuid4 per run (even over --rdzv_id); drun a random
    // id unless --rdzv-id is given.
    return !t.empty() && !d.empty() ? "" : differ();
  }
  if (key == "TORCHELASTIC_ERROR_FILE") {
    // Under a directory made for the run: the log dir's <run id>[_<random suffix>]/, else a
    // fresh temporary directory. What must agree is the part below it:
    // attempt_<restart>/<local_rank>/error.json, and that it is in the log dir when one is given.
    std::string tail = "/attempt_" + w.get("TORCHELASTIC_RESTART_COUNT").value_or("?") + "/" +
                       w.get("LOCAL_RANK").value_or("?") + "/error.json";
    auto ok = [&](const std::string& path, const Launch& l) {
      bool ends = path.size() > tail.size() &&
                  path.compare(path.size() - tail.size(), tail.size(), tail) == 0;
      return ends && under(path, c.logDir ? l.logDir : l.tmpDir);
    };
    if (!ok(t, tl)) return "torchrun's '" + t + "' is not <dir>" + tail + " (test assumption)";
    if (ok(d, dl)) return "";
    return "drun's '" + d + "' is not " + (c.logDir ? "<log dir>/*" : "$TMPDIR/*") + tail;
  }
  if (key == "OMP_NUM_THREADS") {
    // Only when the user left it unset: torchrun 1.13 sets 1 with several workers, drun
    // cores / workers (at least 1; docs/options.md): a deliberate difference.
    return isPositiveInt(d) ? "" : differ();
  }
  if (key == "TORCHELASTIC_USE_AGENT_STORE" && t == "True" && d == "False") {
    // Static backend: torchrun's agent serves a TCPStore at MASTER_ADDR:MASTER_PORT and tells
    // env:// to connect to it; drun's agent serves none there, so rank 0's init_process_group
    // must host it ("False"). Either way init_process_group(env://) works unchanged.
    return "";
  }
  return t == d ? "" : differ();
}

}  // namespace drun::test::torchrun_compat

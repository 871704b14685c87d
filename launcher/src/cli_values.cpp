// One option's text into its value (cli_parts.hpp): counts, ranges, rank lists, signals, paths.
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <random>
#include <set>
#include <sstream>

#include "cli_parts.hpp"
#include "drun/common/byte_size.hpp"
#include "drun/common/env.hpp"

namespace drun::launch::cli {
namespace {

using agent::StdRouting;

int countCpus() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
}

int countGpus() {
  // NVIDIA's driver lists one directory per GPU; no CUDA runtime needed to count them.
  std::error_code ec;
  int n = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec))
    if (entry.is_directory()) ++n;
  return n;
}

// The rendezvous closes a round with one multi_set of MAX + 3 keys: the store's per-request key
// limit (65536) bounds MAX.
constexpr int kMaxNodes = 65000;

}  // namespace

int parseNproc(const std::string& text) {
  if (text == "cpu") return countCpus();
  if (text == "gpu") {
    int gpus = countGpus();
    if (gpus == 0) throw UsageError("--nproc-per-node gpu: no GPU found on this host");
    return gpus;
  }
  if (text == "auto") {
    int gpus = countGpus();
    return gpus > 0 ? gpus : countCpus();
  }
  return static_cast<int>(usage([&] {
    return env::parseInt(text, "--nproc-per-node (a positive count, auto, cpu or gpu)", 1, 4096);
  }));
}

std::pair<int, int> parseNnodes(const std::string& text) {
  auto colon = text.find(':');
  const char* what = "--nnodes (N or MIN:MAX, 1 <= MIN <= MAX <= 65000)";
  if (colon == std::string::npos) {
    int n = static_cast<int>(usage([&] { return env::parseInt(text, what, 1, kMaxNodes); }));
    return {n, n};
  }
  int lo = static_cast<int>(usage([&] { return env::parseInt(text.substr(0, colon), what, 1, kMaxNodes); }));
  int hi = static_cast<int>(usage([&] { return env::parseInt(text.substr(colon + 1), what, 1, kMaxNodes); }));
  if (lo > hi) throw UsageError(std::string(what) + ": MIN " + std::to_string(lo) + " > MAX " + std::to_string(hi));
  return {lo, hi};
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, sep)) out.push_back(item);
  if (!text.empty() && text.back() == sep) out.push_back("");
  return out;
}

// torchrun's --redirects/--tee: "3" for every rank, or "0:1,2:3" per local rank. The two options
// combine per local rank whichever form each has (-r 0:1 -t 3: rank 0's stdout redirected, every
// rank tee'd), so a single value reaches the per-rank entries the other option made, and a new
// entry starts from the single value of the other.
void parseStdSpec(const std::string& text, const char* option, int nproc,
                  int StdRouting::*field, agent::OutputOptions& out) {
  std::string what = std::string(option) + " (0-3, or LOCAL_RANK:0-3,... e.g. 0:1,1:2)";
  if (text.find(':') == std::string::npos) {
    out.defaultRouting.*field = static_cast<int>(usage([&] { return env::parseInt(text, what, 0, 3); }));
    for (auto& [rank, routing] : out.routing) routing.*field = out.defaultRouting.*field;
    return;
  }
  for (const std::string& pair : split(text, ',')) {
    auto colon = pair.find(':');
    if (colon == std::string::npos) throw UsageError(what + ": '" + pair + "' is not LOCAL_RANK:VALUE");
    int rank = static_cast<int>(usage([&] { return env::parseInt(pair.substr(0, colon), what, 0, nproc - 1); }));
    int value = static_cast<int>(usage([&] { return env::parseInt(pair.substr(colon + 1), what, 0, 3); }));
    out.routing.try_emplace(rank, out.defaultRouting).first->second.*field = value;
  }
}

std::vector<int> parseRankList(const std::string& text, int nproc) {
  std::string what = "--local-ranks-filter (comma-separated local ranks, e.g. 0,2)";
  std::set<int> ranks;
  for (const std::string& item : split(text, ','))
    ranks.insert(static_cast<int>(usage([&] { return env::parseInt(item, what, 0, nproc - 1); })));
  if (ranks.empty()) throw UsageError(what + ": empty");
  return {ranks.begin(), ranks.end()};
}

// 128 random bits as 32 hex digits (each 32-bit part zero-padded: the length never varies).
std::string randomRunId() {
  std::random_device rd;
  char buf[33];
  std::snprintf(buf, sizeof buf, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  return buf;
}

// The console prefix macros (output_mux expands them): anything else in ${...} is a typo.
void validatePrefix(const std::string& tmpl) {
  static const char* const kMacros[] = {"rank", "local_rank", "role_name", "hostname"};
  for (size_t at = tmpl.find("${"); at != std::string::npos; at = tmpl.find("${", at + 2)) {
    const size_t close = tmpl.find('}', at);
    if (close == std::string::npos)
      throw UsageError("--prefix: unterminated '${' in '" + tmpl + "'");
    const std::string name = tmpl.substr(at + 2, close - at - 2);
    if (std::none_of(std::begin(kMacros), std::end(kMacros), [&](const char* m) { return name == m; }))
      throw UsageError("--prefix: unknown macro '${" + name + "}' (known: ${rank}, ${local_rank}, "
                       "${role_name}, ${hostname})");
  }
}

std::string thisHostname() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

// --tty auto|always|never, --stdin RANK|none.
void parseTerminalOptions(const std::string& tty, const std::string& stdinRank, agent::OutputOptions& out) {
  if (tty == "auto") out.tty = agent::TtyMode::Auto;
  else if (tty == "always") out.tty = agent::TtyMode::Always;
  else if (tty == "never") out.tty = agent::TtyMode::Never;
  else throw UsageError("--tty: expected auto, always or never, got '" + tty + "'");
  if (stdinRank == "none") out.stdinRank.reset();
  else out.stdinRank = static_cast<int>(usage([&] { return env::parseInt(stdinRank, "--stdin (a global rank >= 0, or none)", 0, 1 << 30); }));
}

// --signals-to-handle: torchrun's comma-separated names (SIGUSR1, or USR1, or a number). Only
// signals that mean "end the job" make sense; job control, faults and SIGKILL/SIGSTOP do not.
std::vector<int> parseSignals(const std::string& text) {
  static const std::pair<const char*, int> kAllowed[] = {
      {"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT},     {"TERM", SIGTERM},
      {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"ALRM", SIGALRM},     {"XCPU", SIGXCPU},
      {"XFSZ", SIGXFSZ}, {"PWR", SIGPWR},   {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF}};
  std::vector<int> out;
  for (std::string item : split(text, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    std::string name = item;
    for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (name.rfind("SIG", 0) == 0) name.erase(0, 3);
    int number = 0;
    for (const auto& [known, sig] : kAllowed)
      if (name == known || name == std::to_string(sig)) number = sig;
    if (number == 0) {
      std::string names;
      for (const auto& [known, sig] : kAllowed) names += (names.empty() ? "SIG" : ", SIG") + std::string(known);
      throw UsageError("--signals-to-handle: '" + item + "' is not a signal drun can forward (one of " +
                       names + ")");
    }
    if (std::find(out.begin(), out.end(), number) == out.end()) out.push_back(number);
  }
  return out;
}

// --log-dir must be a directory, or name one drun can create: a file on the way is a usage
// error (not a raw filesystem error once the job starts).
void checkLogDir(const std::filesystem::path& dir) {
  std::error_code ec;
  for (std::filesystem::path p = dir; !p.empty(); p = p.parent_path()) {
    auto status = std::filesystem::status(p, ec);
    if (std::filesystem::exists(status)) {
      if (!std::filesystem::is_directory(status))
        throw UsageError("--log-dir " + dir.string() + ": " +
                         (p == dir ? "is a file, not a directory" : p.string() + " is a file, not a directory"));
      break;
    }
    if (p == p.parent_path()) break;
  }
  // Made now, so that a path nobody may write (a read-only file system, /sys) is a usage error
  // naming the option, not a failure of the job's start.
  std::filesystem::create_directories(dir, ec);
  if (ec) throw UsageError("--log-dir " + dir.string() + ": cannot create it: " + ec.message());
}

agent::LogRotation parseLogRotation(const std::string& maxBytes, const std::string& maxFiles) {
  agent::LogRotation out;
  out.maxBytes = usage([&] { return parseByteSize(maxBytes, "--log-max-bytes"); });
  out.maxFiles = static_cast<int>(
      usage([&] { return env::parseInt(maxFiles, "--log-max-files (a count, 0-1000)", 0, 1000); }));
  return out;
}

}  // namespace drun::launch::cli

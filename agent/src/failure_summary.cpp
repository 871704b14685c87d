#include "drun/agent/failure_summary.hpp"

#include <signal.h>
#include <string.h>

#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace drun::agent {
namespace {

constexpr size_t kMaxErrorFileBytes = 64 * 1024;

std::string isoTime(std::chrono::system_clock::time_point when) {
  auto seconds = std::chrono::system_clock::to_time_t(when);
  auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(when.time_since_epoch()).count() % 1000;
  std::tm tm{};
  ::gmtime_r(&seconds, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[80];
  std::snprintf(out, sizeof out, "%s.%03lldZ", buf, static_cast<long long>(millis));
  return out;
}

void appendIndented(std::ostringstream& out, const std::string& text) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) out << "\ndrun:     " << line;
}

}  // namespace

std::string signalName(int signal) {
  const char* abbrev = ::sigabbrev_np(signal);
  if (abbrev) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(signal);
}

std::optional<std::string> readErrorFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text(kMaxErrorFileBytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_object() && json.contains("message")) {
    const auto& message = json["message"];
    if (message.is_string()) return message.get<std::string>();
    if (message.is_object()) {
      std::string out = message.value("message", std::string());
      if (message.contains("extraInfo") && message["extraInfo"].is_object()) {
        const auto& extra = message["extraInfo"];
        if (extra.contains("py_callstack") && extra["py_callstack"].is_string())
          out += "\n" + extra["py_callstack"].get<std::string>();
      }
      if (!out.empty()) return out;
    }
  }
  return text;
}

rdzv::FailureRecord makeFailureRecord(const WorkerExit& rootCause, const std::string& node,
                                      const std::filesystem::path& errorFile, int otherFailures) {
  rdzv::FailureRecord r;
  r.rank = rootCause.globalRank;
  r.localRank = rootCause.localRank;
  r.node = node;
  r.exitCode = rootCause.exitCode;
  r.signal = rootCause.signal;
  r.pid = rootCause.pid;
  r.timeMs = std::chrono::duration_cast<std::chrono::milliseconds>(
                 rootCause.when.time_since_epoch()).count();
  r.otherFailures = otherFailures;
  std::optional<std::string> message;
  try {
    message = readErrorFile(errorFile);
  } catch (const std::exception& e) {
    // A file a worker wrote is untrusted: whatever it holds, the summary still comes.
    message = "(unreadable error file: " + std::string(e.what()) + ")";
  }
  if (message) {
    r.detailSource = "error file " + errorFile.string();
    r.detail = *message;
  } else if (!rootCause.stderrTail.empty()) {
    r.detailSource = "stderr";
    for (const std::string& line : rootCause.stderrTail) r.detail += line + "\n";
  }
  return r;
}

std::string formatFailureSummary(const rdzv::FailureRecord& cause) {
  std::ostringstream out;
  out << "drun: root cause: rank " << cause.rank << " (local_rank " << cause.localRank << ") on "
      << cause.node;
  if (cause.signal)
    out << " was killed by signal " << signalName(cause.signal) << " (" << cause.signal << ")";
  else
    out << " exited with code " << cause.exitCode;
  out << "\ndrun:   pid: " << cause.pid;
  out << "\ndrun:   time: "
      << isoTime(std::chrono::system_clock::time_point(std::chrono::milliseconds(cause.timeMs)));
  if (cause.detailSource == "stderr")
    out << "\ndrun:   last lines of stderr:";
  else if (!cause.detailSource.empty())
    out << "\ndrun:   " << cause.detailSource << ":";
  else
    out << "\ndrun:   (no error file and no stderr output)";
  appendIndented(out, cause.detail);
  if (cause.otherFailures > 0)
    out << "\ndrun:   " << cause.otherFailures << " other worker(s) failed after it or were stopped";
  return out.str();
}

}  // namespace drun::agent

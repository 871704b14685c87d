#include "drun/agent/failure_summary.hpp"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <string_view>

namespace drun::agent {
namespace {

using nlohmann::json;

constexpr size_t kMaxShownMessageBytes = 64 * 1024;  // of an error file's message, in the summary
constexpr size_t kMaxShownReasonBytes = 300;        // of what is wrong with one
constexpr size_t kMaxJsonDepth = 64;                // torch's files are 3 levels deep

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

namespace {

// Bytes quoted from a file, safe on a terminal: control characters and non-ASCII as \xNN, cut.
std::string printable(std::string_view text, size_t max) {
  std::string out;
  for (unsigned char c : text.substr(0, max)) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  if (text.size() > max) out += "...";
  return out;
}

std::string describeType(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "null";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return std::string("a ") + value.type_name();
  }
}

ErrorFile errorFile(ErrorFile::State state, std::string text) { return {state, std::move(text)}; }

// Reads the whole file (bounded) into `content` and returns nullopt, or returns why not (Absent
// when there is no file, Unreadable).
std::optional<ErrorFile> readBounded(const std::filesystem::path& path, std::string& content) {
  // O_NONBLOCK: a FIFO in its place must not hang the summary.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return ErrorFile{};
    return errorFile(ErrorFile::State::Unreadable, std::strerror(errno));
  }
  struct stat st;
  std::string problem;
  if (::fstat(fd, &st) != 0) {
    problem = std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    problem = S_ISDIR(st.st_mode) ? "a directory" : "not a regular file";
  } else {
    content.resize(kMaxErrorFileBytes + 1);  // one more byte says it is too large
    size_t got = 0;
    while (got < content.size()) {
      ssize_t n = ::read(fd, content.data() + got, content.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) problem = std::strerror(errno);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    content.resize(got);
    if (problem.empty() && got > kMaxErrorFileBytes)
      problem = "larger than " + std::to_string(kMaxErrorFileBytes / 1024) + " KiB";
  }
  ::close(fd);
  if (!problem.empty()) return errorFile(ErrorFile::State::Unreadable, problem);
  return std::nullopt;
}

// torch's two shapes; anything else says what is wrong with it.
ErrorFile parseErrorFile(const std::string& content) {
  auto malformed = [](std::string why) {
    return errorFile(ErrorFile::State::Malformed, std::move(why));
  };
  if (content.find_first_not_of(" \t\r\n") == std::string::npos) return malformed("empty");
  if (jsonNestingDepth(content) > kMaxJsonDepth)
    return malformed("JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  json doc;
  try {
    doc = json::parse(content);
  } catch (const json::exception& e) {
    std::string_view what = e.what();  // "[json.exception.parse_error.101] parse error at ..."
    if (auto end = what.find("] "); what.rfind("[json.", 0) == 0 && end != std::string_view::npos)
      what.remove_prefix(end + 2);
    return malformed("not JSON (" + printable(what, kMaxShownReasonBytes) + ")");
  }
  if (!doc.is_object()) return malformed(describeType(doc) + ", not an object with a \"message\"");
  auto message = doc.find("message");
  if (message == doc.end()) return malformed("no \"message\" field");
  std::string text;
  if (message->is_string()) {
    text = message->get<std::string>();
    if (text.empty()) return malformed("\"message\" is empty");
  } else if (message->is_object()) {
    auto inner = message->find("message");
    if (inner == message->end()) return malformed("\"message\" has no \"message\" field");
    if (!inner->is_string())
      return malformed("\"message.message\" is " + describeType(*inner) + ", not a string");
    text = inner->get<std::string>();
    if (text.empty()) return malformed("\"message.message\" is empty");
    // The call stack is a bonus: a wrong type there costs only the call stack.
    auto extra = message->find("extraInfo");
    if (extra != message->end() && extra->is_object()) {
      auto stack = extra->find("py_callstack");
      if (stack != extra->end() && stack->is_string() && !stack->get<std::string>().empty())
        text += "\n" + stack->get<std::string>();
    }
  } else {
    return malformed("\"message\" is " + describeType(*message) + ", not a string or an object");
  }
  if (text.size() > kMaxShownMessageBytes) {
    size_t more = text.size() - kMaxShownMessageBytes;
    text.resize(kMaxShownMessageBytes);
    text += "\n... (" + std::to_string(more) + " more bytes)";
  }
  return errorFile(ErrorFile::State::Message, std::move(text));
}

}  // namespace

size_t jsonNestingDepth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool inString = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (inString) {
      if (c == '\\') ++i;
      else if (c == '"') inString = false;
    } else if (c == '"') {
      inString = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

ErrorFile readErrorFile(const std::filesystem::path& path) noexcept {
  try {
    std::string content;
    if (auto unusable = readBounded(path, content)) return *unusable;
    return parseErrorFile(content);
  } catch (...) {  // memory: say so rather than fail the summary
    ErrorFile file{ErrorFile::State::Unreadable, {}};
    try {
      file.text = "cannot be processed (out of memory)";
    } catch (...) {
    }
    return file;
  }
}

FailureEvidence failureEvidence(const std::filesystem::path& errorFile,
                                const std::deque<std::string>& stderrTail, bool showPath) {
  FailureEvidence evidence;
  ErrorFile file = readErrorFile(errorFile);
  const std::string name = showPath ? "error file " + errorFile.string() : std::string("error file");
  if (file.state == ErrorFile::State::Message) {
    evidence.source = name;
    evidence.detail = std::move(file.text);
    return evidence;
  }
  for (const std::string& line : stderrTail) evidence.detail += line + "\n";
  if (file.state == ErrorFile::State::Absent) {
    if (!stderrTail.empty()) evidence.source = "stderr";
    return evidence;
  }
  evidence.source = name + " is " +
                    (file.state == ErrorFile::State::Unreadable ? "unreadable" : "malformed") +
                    ": " + file.text + "; last lines of stderr";
  if (stderrTail.empty()) evidence.detail = "(no stderr output)";
  return evidence;
}

rdzv::FailureRecord makeFailureRecord(const WorkerExit& rootCause, const std::string& node,
                                      const std::filesystem::path& errorFile, int otherFailures,
                                      bool showPath) {
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
  // Nothing on stderr: the last stdout lines often hold the error (a program that prints it).
  const bool fromStdout = rootCause.stderrTail.empty() && !rootCause.stdoutTail.empty();
  FailureEvidence evidence = failureEvidence(
      errorFile, fromStdout ? rootCause.stdoutTail : rootCause.stderrTail, showPath);
  if (fromStdout && evidence.source == "stderr")
    evidence.source = "no stderr output; last lines of stdout";
  r.detailSource = std::move(evidence.source);
  r.detail = std::move(evidence.detail);
  return r;
}

namespace {
constexpr std::string_view kHangPrefix = "hang (stack: ";
constexpr std::string_view kWhyPrefix = "why: ";

// Where a faulthandler traceback says the thread it was delivered to stood (its innermost
// frame, "hang.py:12 in <module>"), else "".
std::string pythonWhere(const std::string& traceback) {
  static const std::regex frame(R"re(File "([^"\n]*)", line ([0-9]+) in ([^\s]+))re");
  size_t from = traceback.find("Current thread ");
  if (from == std::string::npos) from = 0;
  std::smatch m;
  auto begin = traceback.begin() + static_cast<std::ptrdiff_t>(from);
  if (!std::regex_search(begin, traceback.end(), m, frame)) return "";
  std::string file = m[1].str();
  if (auto slash = file.rfind('/'); slash != std::string::npos) file = file.substr(slash + 1);
  return printable(file, 100) + ":" + m[2].str() + " in " + printable(m[3].str(), 100);
}

// "eu-stack" and "no heartbeat ..." from "hang (stack: eu-stack): no heartbeat ...".
std::pair<std::string, std::string> splitHang(const std::string& source) {
  auto end = source.find("): ", kHangPrefix.size());
  if (end == std::string::npos) return {"", source.substr(kHangPrefix.size())};
  return {source.substr(kHangPrefix.size(), end - kHangPrefix.size()), source.substr(end + 3)};
}
}  // namespace

void markHang(rdzv::FailureRecord& record, const std::string& what, const std::string& stackHow,
              const std::string& stack, const std::string& why) {
  record.detailSource = std::string(kHangPrefix) + (stackHow.empty() ? "none" : stackHow) + "): " + what;
  if (!stack.empty()) record.detail = stack;
  if (why.empty()) return;
  std::string line = std::string(kWhyPrefix) + why;
  // The Python line goes with the culprit's own part, the first ("...(its main thread is in X)").
  if (std::string where = stackHow == "faulthandler" ? pythonWhere(record.detail) : ""; !where.empty()) {
    const size_t end = std::min(line.find("; "), line.size());
    if (line[end - 1] == ')') line.insert(end - 1, ", Python at " + where);
    else line.insert(end, " (Python at " + where + ")");
  }
  record.detail = line + "\n" + record.detail;
}

bool isHang(const rdzv::FailureRecord& record) {
  return record.detailSource.rfind(kHangPrefix, 0) == 0;
}

bool isLearnedHang(const rdzv::FailureRecord& record) {
  return isHang(record) && splitHang(record.detailSource).second.find("(learned timeout ") != std::string::npos;
}

std::string describeStatus(const rdzv::FailureRecord& f) {
  if (isHang(f)) return "hung: " + splitHang(f.detailSource).second;
  return f.signal ? "signal " + signalName(f.signal) : "exit code " + std::to_string(f.exitCode);
}

std::string formatFailureSummary(const rdzv::FailureRecord& cause) {
  std::ostringstream out;
  out << "drun: root cause: rank " << cause.rank << " (local_rank " << cause.localRank << ") on "
      << cause.node;
  if (isHang(cause)) {
    auto [how, what] = splitHang(cause.detailSource);
    out << " hung: " << what;
    out << "\ndrun:   pid: " << cause.pid << " (stopped with signal " << signalName(cause.signal) << ")";
    out << "\ndrun:   time: "
        << isoTime(std::chrono::system_clock::time_point(std::chrono::milliseconds(cause.timeMs)));
    std::string_view stack = cause.detail;
    if (stack.substr(0, kWhyPrefix.size()) == kWhyPrefix) {
      const size_t end = std::min(stack.find('\n'), stack.size());
      out << "\ndrun:   " << stack.substr(0, end);
      stack.remove_prefix(std::min(end + 1, stack.size()));
    }
    if (how == "faulthandler")
      out << "\ndrun:   its Python stack (faulthandler, last lines of stderr):";
    else
      out << "\ndrun:   its stack (" << how << "):";
    appendIndented(out, stack.empty() ? "(none captured)" : std::string(stack));
    if (cause.otherFailures > 0)
      out << "\ndrun:   " << cause.otherFailures << " other worker(s) failed after it or were stopped";
    return out.str();
  }
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

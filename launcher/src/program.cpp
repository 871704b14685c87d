#include "drun/launcher/program.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include "drun/common/env.hpp"
#include "drun/launcher/cli.hpp"

namespace drun::launch {
namespace {

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Checks one candidate path: "" when runnable, else the reason it is not.
std::string whyNotRunnable(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "not found";
  if (S_ISDIR(st.st_mode)) return "is a directory";
  if (::access(path.c_str(), X_OK) != 0) return "is not executable";
  return "";
}

// The interpreter for .py programs and -m modules, and where the choice came from, so that a
// message about it can say which knob to turn.
struct Interpreter {
  std::string name;
  std::string source;
};

Interpreter pythonInterpreter() {
  if (auto v = env::get("PYTHON_EXEC"); v && !v->empty()) return {*v, "PYTHON_EXEC"};
  if (auto v = env::get("DRUN_PYTHON"); v && !v->empty()) return {*v, "DRUN_PYTHON"};
  return {env::getString("DRUN_PYTHON"), "the default; PYTHON_EXEC picks another"};
}

}  // namespace

std::string findExecutable(const std::string& name) {
  if (name.empty()) throw UsageError("the program name is empty");
  if (name.find('/') != std::string::npos) {
    std::string why = whyNotRunnable(name);
    if (why == "not found") throw UsageError("program '" + name + "' not found");
    if (!why.empty()) throw UsageError("program '" + name + "' " + why);
    return name;
  }
  std::string path = env::get("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  std::string firstProblem;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    std::string why = whyNotRunnable(candidate);
    if (why.empty()) return candidate;
    if (why != "not found" && firstProblem.empty()) firstProblem = candidate + " " + why;
    start = end + 1;
  }
  if (!firstProblem.empty()) throw UsageError("program '" + name + "': " + firstProblem);
  throw UsageError("program '" + name + "' not found in PATH");
}

ResolvedProgram resolveProgram(const ProgramRequest& request) {
  if (request.programAndArgs.empty())
    throw UsageError(request.module ? "-m needs a module name" : "missing the program to run");
  if (request.module && request.noPython)
    throw UsageError("--no-python cannot be combined with -m/--module");
  const std::string& program = request.programAndArgs.front();
  std::vector<std::string> rest(request.programAndArgs.begin() + 1, request.programAndArgs.end());

  ResolvedProgram out;
  if (!request.noPython && (request.module || endsWith(program, ".py"))) {
    if (!request.module) {
      struct stat st {};
      if (::stat(program.c_str(), &st) != 0) throw UsageError("python program '" + program + "' not found");
      if (S_ISDIR(st.st_mode)) throw UsageError("python program '" + program + "' is a directory");
    }
    out.isPython = true;
    const Interpreter python = pythonInterpreter();
    std::string path;
    try {
      path = findExecutable(python.name);
    } catch (const UsageError& e) {
      throw UsageError("python interpreter (" + python.source + "): " + e.what());
    }
    out.interpreter = path + " (" + (path == python.name ? "" : python.name + " from PATH, ") +
                      python.source + ")";
    out.argv = {path, "-u"};
    if (request.module) out.argv.push_back("-m");
    out.argv.push_back(program);
  } else {
    out.argv = {findExecutable(program)};
  }
  out.argv.insert(out.argv.end(), rest.begin(), rest.end());
  return out;
}

}  // namespace drun::launch

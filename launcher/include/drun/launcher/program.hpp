// Turns the user's PROGRAM [ARGS...] into the argv each worker execs, as torchrun does:
// "x.py" and "-m module" run under the Python interpreter ($PYTHON_EXEC, else $DRUN_PYTHON, else
// python3 from PATH); --no-python execs PROGRAM as given; anything else is exec'd directly.
// The executable is resolved now (PATH search, existence, execute permission), so a typo fails
// with exit 2 before any worker starts. Stateless.
#pragma once

#include <string>
#include <vector>

namespace drun::launch {

struct ProgramRequest {
  std::vector<std::string> programAndArgs;  // PROGRAM (or module) followed by its arguments
  bool module = false;                      // -m
  bool noPython = false;                    // --no-python
};

struct ResolvedProgram {
  std::vector<std::string> argv;  // argv[0] is an absolute or relative path that exists
  bool isPython = false;
  // For messages about a Python worker: "/usr/bin/python3 ('python3', the default; ...)".
  std::string interpreter;
};

// Throws launch::UsageError.
ResolvedProgram resolveProgram(const ProgramRequest& request);

// Finds `name` in PATH (or checks it when it contains '/'); returns the path or throws UsageError
// "program 'x' not found in PATH" / "'x' is not executable" / "'x' is a directory".
std::string findExecutable(const std::string& name);

}  // namespace drun::launch

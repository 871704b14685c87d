// What the PyTorch tests (tests/torch_test.cpp, tests/torchrun_compat_test.cpp) need to find: the
// interpreter that has torch, the programs in tests/torch/, and torchrun 1.13 itself
// (scripts/bench/torchrun_compat.py). Debian's python3-torch is for /usr/bin/python3; `python3`
// on PATH may be another interpreter without torch, so every test says which one it means.
//
// skipWithoutTorch() ends the test SKIPPED (exit 77), naming what is missing, where that
// interpreter or its torch is not installed. Header-only: a few paths and one check.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

#include "drun/common/test_skip.hpp"
#include "process.hpp"

namespace drun::test {

inline constexpr const char* kTorchPython = "/usr/bin/python3";

// tests/torch/<name> in the source tree (the test binaries are compiled with its path).
inline std::filesystem::path torchProgram(const std::string& name) {
  return std::filesystem::path(DRUN_SOURCE_DIR) / "tests" / "torch" / name;
}

inline std::filesystem::path torchrunCompat() {
  return std::filesystem::path(DRUN_SOURCE_DIR) / "scripts" / "bench" / "torchrun_compat.py";
}

// The Python package drun builds (<build>/lib/drun/python: drun.comm, drun.torch), for
// PYTHONPATH until the agent puts it there for its workers.
inline std::string drunPythonPath() {
  return "PYTHONPATH=" + (buildDir() / "lib" / "drun" / "python").string();
}

// SKIPPED unless kTorchPython can find `module` (find_spec: no import, which costs seconds).
inline void skipWithoutPythonModule(const std::string& test, const std::string& module,
                                    const std::string& package) {
  if (::access(kTorchPython, X_OK) != 0)
    skipTest(test + ": " + kTorchPython + " is missing (scripts/setup.sh --tests installs " +
             package + ")");
  RunOptions o;
  o.argv = {kTorchPython, "-c",
            "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('" + module +
                "') else 3)"};
  o.timeout = std::chrono::seconds(20);
  if (RunResult r = run(o); r.status() != 0)
    skipTest(test + ": " + kTorchPython + " cannot find the " + module + " package (install " +
             package + "): " + r.describe());
}

inline void skipWithoutTorch(const std::string& test) {
  skipWithoutPythonModule(test, "torch", "python3-torch");
}

// SKIPPED unless the build made drun.torch's compiled module (CMake found libtorch-dev).
inline void skipWithoutDrunTorch(const std::string& test) {
  skipWithoutTorch(test);
  auto dir = buildDir() / "lib" / "drun" / "python" / "drun" / "torch";
  if (std::filesystem::exists(dir))
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      if (entry.path().filename().string().rfind("_backend", 0) == 0) return;
  skipTest(test + ": drun.torch's module was not built in " + dir.string() +
           " (CMake did not find libtorch-dev / pybind11-dev / python3-dev)");
}

}  // namespace drun::test

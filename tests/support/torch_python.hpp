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

inline void skipWithoutTorch(const std::string& test) {
  if (::access(kTorchPython, X_OK) != 0)
    skipTest(test + ": " + kTorchPython + " is missing (scripts/setup.sh installs python3-torch)");
  // find_spec looks torch up without importing it (an import costs seconds here).
  RunOptions o;
  o.argv = {kTorchPython, "-c",
            "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('torch') else 3)"};
  o.timeout = std::chrono::seconds(20);
  if (RunResult r = run(o); r.status() != 0)
    skipTest(test + ": " + kTorchPython +
             " cannot find the torch package (install python3-torch): " + r.describe());
}

}  // namespace drun::test

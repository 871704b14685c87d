// libFuzzer target for the command-line parser (cli_check.hpp says what is checked).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli_check.hpp"

extern char** environ;

// Hermetic: the parser also reads PET_*, SLURM_*, PYTHON_EXEC and DRUN_* settings; the
// fuzzer's outcome must depend on its input only, not on the shell it was started from.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::vector<std::string> names;
  for (char** e = environ; *e; ++e) {
    std::string var(*e);
    std::string name = var.substr(0, var.find('='));
    if (name.rfind("PET_", 0) == 0 || name.rfind("SLURM_", 0) == 0 ||
        name.rfind("DRUN_", 0) == 0 || name == "PYTHON_EXEC" || name.rfind("TORCH", 0) == 0)
      names.push_back(name);
  }
  for (const auto& name : names) ::unsetenv(name.c_str());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  drun::launch::fuzz::checkCliInput(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

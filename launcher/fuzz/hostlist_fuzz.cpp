// libFuzzer target for the SLURM hostlist parser (hostlist_check.hpp says what is checked).
#include <cstddef>
#include <cstdint>

#include "hostlist_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  drun::launch::fuzz::checkHostlistInput(
      std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

// libFuzzer target for the key-scheme parsers (keys_check.hpp says what is checked).
#include <cstddef>
#include <cstdint>

#include "keys_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  drun::rdzv::fuzz::checkKeysInput(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

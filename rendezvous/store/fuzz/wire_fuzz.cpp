// libFuzzer target for the wire codec (rendezvous/store/fuzz/wire_check.hpp says what is checked).
// Built with -DDRUN_FUZZ=ON (clang++ -fsanitize=fuzzer,address,undefined); CTest runs it for
// DRUN_FUZZ_SECONDS over rendezvous/store/fuzz/corpus/wire.
#include <cstddef>
#include <cstdint>

#include "wire_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  drun::rdzv::fuzz::checkWireInput(
      std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

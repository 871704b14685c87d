// libFuzzer target for the store server fed arbitrary byte streams (rendezvous/store/fuzz/
// server_check.hpp says what is checked). Built with -DDRUN_FUZZ=ON (clang++ 16,
// -fsanitize=fuzzer,address,undefined); CTest runs it for DRUN_FUZZ_SECONDS over
// rendezvous/store/fuzz/corpus/server.
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "server_check.hpp"

// The server's log lines (peer text in them included) are formatted at every level, into a sink
// that drops them: the fuzzer's output stays readable and fast.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  auto logger = std::make_shared<spdlog::logger>("fuzz",
                                                 std::make_shared<spdlog::sinks::null_sink_mt>());
  logger->set_level(spdlog::level::trace);
  spdlog::set_default_logger(logger);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  drun::rdzv::fuzz::checkServerInput(
      std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}

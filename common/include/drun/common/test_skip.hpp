// skipTest: how a Catch2 (v2, which has no skip) test that cannot run here says so. It prints the
// reason and ends the test process with kSkipReturnCode, which CTest reports as SKIPPED (every
// test binary is registered with SKIP_RETURN_CODE 77; see drun_add_tests): never a silent pass.
// Each CTest entry runs one test case, so ending the process skips just that case.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace drun::test {

inline constexpr int kSkipReturnCode = 77;

[[noreturn]] inline void skipTest(const std::string& why) {
  std::printf("SKIPPED: %s\n", why.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(kSkipReturnCode);
}

}  // namespace drun::test

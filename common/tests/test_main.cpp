// The one Catch2 main shared by every test binary.
#define CATCH_CONFIG_RUNNER
#include <spdlog/spdlog.h>

#include <catch2/catch.hpp>

int main(int argc, char** argv) {
  // spdlog's registry first: statics that tests create later (a server a fuzz check keeps for the
  // whole run, say) are destroyed before it, so their threads never log into a destroyed registry
  // at exit (ThreadSanitizer reports that).
  spdlog::default_logger_raw();
  return Catch::Session().run(argc, argv);
}

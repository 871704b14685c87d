// FileStore (file:// init): the Store contract across two handles of one file, and what a file
// cannot do (no liveness). Moved here from comm/tests/comm_unit_test.cpp with the store itself.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <type_traits>

#include "drun/common/error.hpp"
#include "drun/store/file_store.hpp"
#include "drun/store/prefix_store.hpp"

using namespace std::chrono_literals;

namespace {
std::string tempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("drun-store-test-" + name + "-" + std::to_string(getpid()))).string();
}
}  // namespace

TEST_CASE("store: the file store keeps the store contract across handles", "[store]") {
  std::string path = tempPath("filestore");
  std::filesystem::remove(path);
  drun::rdzv::FileStore a(path), b(path);
  a.set("k", "v");
  CHECK(b.get("k", 1s) == "v");
  CHECK(b.add("n", 2) == 2);
  CHECK(a.add("n", 3) == 5);
  CHECK(a.compareSet("k", "v", "w") == "w");
  CHECK_FALSE(b.tryGet("missing"));
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(b.wait({"never"}, 50ms), drun::TimeoutError);
  CHECK(std::chrono::steady_clock::now() - t0 >= 50ms);
  CHECK(a.deleteKey("n"));
  CHECK(b.numKeys() == 1);
  // A file cannot act for a process that died: a Store, not a LivenessStore, and a prefix view
  // of it says so when asked for a will.
  STATIC_REQUIRE_FALSE(std::is_base_of_v<drun::rdzv::LivenessStore, drun::rdzv::FileStore>);
  drun::rdzv::PrefixStore view("p/", std::make_shared<drun::rdzv::FileStore>(path));
  CHECK_FALSE(view.hasLiveness());
  CHECK_THROWS_WITH(view.setWill({}), Catch::Contains("no liveness"));
  std::filesystem::remove(path);
}

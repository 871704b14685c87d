// readTokenFile: the store's secret is read only from a private file, and a bad one is named.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "drun/common/error.hpp"
#include "drun/store/token_file.hpp"

using namespace drun::rdzv;
namespace fs = std::filesystem;

namespace {

struct Dir {
  fs::path path;
  Dir() {
    char tmpl[] = "/tmp/drun-token-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~Dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path write(const std::string& name, const std::string& content, mode_t mode) {
    fs::path p = path / name;
    std::ofstream(p) << content;
    REQUIRE(::chmod(p.c_str(), mode) == 0);
    return p;
  }
};

std::string errorOf(const fs::path& p) {
  try {
    readTokenFile(p.string(), "--rdzv-conf token_file");
  } catch (const drun::InvalidArgument& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace

TEST_CASE("token file: a private file is read without its trailing newline", "[token]") {
  Dir d;
  CHECK(readTokenFile(d.write("t", "0123456789abcdef-xyz\n", 0600).string(), "t") ==
        "0123456789abcdef-xyz");
  CHECK(readTokenFile(d.write("r", "0123456789abcdef-xyz", 0400).string(), "t") ==
        "0123456789abcdef-xyz");
}

TEST_CASE("token file: readable by others, short, long, missing or not a file is refused",
          "[token]") {
  Dir d;
  std::string e = errorOf(d.write("group", "0123456789abcdef-xyz", 0640));
  CHECK_THAT(e, Catch::Contains("--rdzv-conf token_file"));
  CHECK_THAT(e, Catch::Contains("mode 640"));
  CHECK_THAT(e, Catch::Contains("chmod 600"));
  CHECK_THAT(errorOf(d.write("world", "0123456789abcdef-xyz", 0604)), Catch::Contains("chmod 600"));
  CHECK_THAT(errorOf(d.write("short", "secret\n", 0600)), Catch::Contains("this one 6"));
  CHECK_THAT(errorOf(d.write("empty", "", 0600)), Catch::Contains("this one 0"));
  CHECK_THAT(errorOf(d.write("long", std::string(kMaxTokenBytes + 10, 'x'), 0600)),
             Catch::Contains("more than a token"));
  CHECK_THAT(errorOf(d.path / "missing"), Catch::Contains("cannot open"));
  fs::create_directory(d.path / "dir");
  ::chmod((d.path / "dir").c_str(), 0700);
  CHECK_THAT(errorOf(d.path / "dir"), Catch::Contains("not a regular file"));
}

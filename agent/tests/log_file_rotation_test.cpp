// LogFileWriter with a LogRotation: files cut at exactly maxBytes, FILE.1 the newest full one, the
// oldest past maxFiles dropped, nothing lost among the kept files; 0 bytes never rotates.
#include <catch2/catch.hpp>

#include "log_file_writer.hpp"
#include "test_support.hpp"

using drun::agent::LogRotation;
using drun::agent::detail::LogFileWriter;
using drun::agent::test::readFile;
using drun::agent::test::TempDir;
namespace fs = std::filesystem;

namespace {

// "0000\n0001\n..." : `count` lines of five bytes each.
std::string numberedLines(int count) {
  std::string out;
  for (int i = 0; i < count; ++i) {
    char line[8];
    std::snprintf(line, sizeof line, "%04d\n", i);
    out += line;
  }
  return out;
}

// Writes `text` in chunks of `chunk` bytes through a writer of its own and waits for the writes.
void writeInChunks(const fs::path& path, const LogRotation& rotation, const std::string& text, size_t chunk) {
  LogFileWriter writer;
  auto file = writer.open(path, rotation);
  for (size_t at = 0; at < text.size(); at += chunk) writer.write(file, std::string_view(text).substr(at, chunk));
  REQUIRE(writer.drain(std::chrono::seconds(10)));
  CHECK(writer.takeFailures().empty());
}

}  // namespace

TEST_CASE("log file rotation: files of exactly max bytes, the newest in FILE.1, the oldest dropped past "
          "max files, the kept ones the stream's tail",
          "[agent]") {
  TempDir dir;
  const fs::path log = dir.path() / "stdout.log";
  const std::string text = numberedLines(1000);  // 5000 bytes
  // Chunks that straddle the cut (7 bytes against 1000): a chunk is split, not lost or moved.
  writeInChunks(log, {.maxBytes = 1000, .maxFiles = 2}, text, 7);
  CHECK(readFile(log) == text.substr(4000));
  CHECK(readFile(fs::path(log.string() + ".1")) == text.substr(3000, 1000));
  CHECK(readFile(fs::path(log.string() + ".2")) == text.substr(2000, 1000));
  CHECK_FALSE(fs::exists(log.string() + ".3"));

  // One write larger than several files: cut into as many.
  const fs::path big = dir.path() / "stderr.log";
  writeInChunks(big, {.maxBytes = 1024, .maxFiles = 3}, text, text.size());
  std::string kept;
  for (const char* suffix : {".3", ".2", ".1", ""}) {
    const std::string part = readFile(fs::path(big.string() + suffix));
    if (*suffix) CHECK(part.size() == 1024);
    kept += part;
  }
  CHECK(kept == text.substr(text.size() - kept.size()));
  CHECK(kept.size() == 3 * 1024 + (5000 - 4 * 1024));
}

TEST_CASE("log file rotation: 0 bytes never rotates, 0 files keeps only the current file", "[agent]") {
  TempDir dir;
  const std::string text = numberedLines(1000);
  const fs::path unbounded = dir.path() / "a.log";
  writeInChunks(unbounded, {}, text, 100);
  CHECK(readFile(unbounded) == text);
  CHECK_FALSE(fs::exists(unbounded.string() + ".1"));

  const fs::path single = dir.path() / "b.log";
  writeInChunks(single, {.maxBytes = 1500, .maxFiles = 0}, text, 100);
  CHECK(readFile(single) == text.substr(4500));
  CHECK_FALSE(fs::exists(single.string() + ".1"));
}

// line_writer: a worker that floods stdout (and optionally stderr) with long, checkable lines, in
// arbitrary write(2) chunks, so a launcher that does not reassemble whole lines interleaves them.
//
//   line_writer LINES MIN_BYTES MAX_BYTES [both]
//
// Line i of rank r (r = $RANK) is "<r>:<i>:<len>:" followed by payload up to exactly <len> bytes
// (not counting '\n'); payload byte j is 'a' + (r*131 + i*31 + j) % 26. Lengths are drawn from a
// generator seeded by (r, i), so the test can recompute them. With "both", odd lines go to stderr.
// Chunks are 1..16 KiB, so one line usually takes several writes.
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <string>

namespace {
void writeAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n <= 0) std::exit(9);
    data += n;
    size -= static_cast<size_t>(n);
  }
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  long lines = std::atol(argv[1]);
  long minBytes = std::atol(argv[2]);
  long maxBytes = std::atol(argv[3]);
  bool both = argc > 4 && std::string(argv[4]) == "both";
  const char* rankText = std::getenv("RANK");
  long rank = rankText ? std::atol(rankText) : 0;

  std::mt19937 chunks(static_cast<unsigned>(rank * 7919 + 17));
  std::uniform_int_distribution<size_t> chunkSize(1, 16384);
  for (long i = 0; i < lines; ++i) {
    std::mt19937 lengths(static_cast<unsigned>(rank * 100003 + i));
    long len = std::uniform_int_distribution<long>(minBytes, maxBytes)(lengths);
    std::string line = std::to_string(rank) + ":" + std::to_string(i) + ":" + std::to_string(len) + ":";
    for (long j = static_cast<long>(line.size()); j < len; ++j)
      line.push_back(static_cast<char>('a' + (rank * 131 + i * 31 + j) % 26));
    line.push_back('\n');
    int fd = both && (i % 2 == 1) ? 2 : 1;
    for (size_t done = 0; done < line.size();) {
      size_t n = std::min(chunkSize(chunks), line.size() - done);
      writeAll(fd, line.data() + done, n);
      done += n;
    }
  }
  return 0;
}

// Test helper: writes `count` lines of pseudo-random length in [minLen, maxLen] to stdout and/or
// stderr, through stdio's full buffering so writes cut lines at arbitrary points.
// Line format: "w<rank> <seq> <len> <payload>", payload = <len> copies of one letter.
//   agent-line-writer <rank> <count> <minLen> <maxLen> <out|err|both>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s rank count minLen maxLen out|err|both\n", argv[0]);
    return 2;
  }
  int rank = std::atoi(argv[1]);
  int count = std::atoi(argv[2]);
  long minLen = std::atol(argv[3]);
  long maxLen = std::atol(argv[4]);
  std::string where = argv[5];
  bool toOut = where == "out" || where == "both";
  bool toErr = where == "err" || where == "both";
  static char outBuf[8192], errBuf[8192];
  std::setvbuf(stdout, outBuf, _IOFBF, sizeof outBuf);
  std::setvbuf(stderr, errBuf, _IOFBF, sizeof errBuf);
  unsigned state = 12345u + static_cast<unsigned>(rank) * 7919u;
  std::string line;
  for (int seq = 0; seq < count; ++seq) {
    state = state * 1103515245u + 12345u;
    long len =
        minLen + static_cast<long>((state >> 8) % static_cast<unsigned>(maxLen - minLen + 1));
    line = "w" + std::to_string(rank) + " " + std::to_string(seq) + " " + std::to_string(len) + " ";
    line.append(static_cast<size_t>(len), static_cast<char>('a' + (rank + seq) % 26));
    line += '\n';
    if (toOut) std::fwrite(line.data(), 1, line.size(), stdout);
    if (toErr) std::fwrite(line.data(), 1, line.size(), stderr);
  }
  return 0;
}

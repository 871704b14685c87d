// env_dump: a worker that prints its arguments and environment, one per line, to stdout:
//   arg:<i>=<argv[i]>     for i >= 1
//   env:<KEY>=<VALUE>     for every variable
// then exits 0. One write(2) per line so each line leaves the worker whole.
#include <unistd.h>

#include <string>

extern char** environ;

namespace {
void writeLine(const std::string& line) {
  std::string buf = line + "\n";
  size_t done = 0;
  while (done < buf.size()) {
    ssize_t n = ::write(1, buf.data() + done, buf.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}
}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) writeLine("arg:" + std::to_string(i) + "=" + argv[i]);
  for (char** e = environ; *e; ++e) writeLine(std::string("env:") + *e);
  return 0;
}

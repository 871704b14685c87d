// failover_probe: the benchmark worker for failover time (scripts/bench/launch.sh).
// Reads CLOCK_REALTIME first thing. On the first attempt (TORCHELASTIC_RESTART_COUNT 0 or unset) it
// prints "FAIL <rank> <ns>" and exits 1; on any restart it prints "START <rank> <ns>" and exits 0.
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

int main() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  long long ns = static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec;
  const char* restart = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const char* rank = std::getenv("RANK");
  bool first = !restart || std::strcmp(restart, "0") == 0;
  if (first) clock_gettime(CLOCK_REALTIME, &now), ns = now.tv_sec * 1000000000LL + now.tv_nsec;
  char line[128];
  int n = std::snprintf(line, sizeof line, "%s %s %lld\n", first ? "FAIL" : "START",
                        rank ? rank : "?", ns);
  (void)!::write(1, line, static_cast<size_t>(n));
  return first ? 1 : 0;
}

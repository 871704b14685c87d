// The CPU time a process spent (user + system), for the benchmarks' "what did it cost" columns.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace drun::bench {

// CPU time (user + system) of process `pid` in ms, from /proc; 0 when it cannot be read.
inline double cpuMs(int pid) {
  if (pid <= 0) return 0;
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return 0;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces
  unsigned long long utime = 0, stime = 0;
  if (!p || std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
                        &stime) != 2)
    return 0;
  return 1000.0 * double(utime + stime) / double(::sysconf(_SC_CLK_TCK));
}

}  // namespace drun::bench

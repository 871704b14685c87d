#include "idle_probe.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace drun::agent::detail {
namespace {

// Reads a small /proc file into buf (NUL-terminated); false when it is gone.
bool readProc(const std::string& path, char* buf, size_t size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = ::read(fd, buf, size - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  return true;
}

// pgrp, and utime+stime of the main thread plus the process's cutime+cstime (ticks), from
// /proc/PID/task/PID/stat (comm may hold spaces and parentheses: fields count from the last ')').
bool mainThreadStat(const std::string& task, pid_t* pgrp, uint64_t* ticks) {
  char buf[1024];
  if (!readProc(task + "/stat", buf, sizeof buf)) return false;
  const char* p = std::strrchr(buf, ')');
  if (!p) return false;
  p += 2;  // field 3: state
  uint64_t fields[18] = {};
  for (int field = 3; field <= 17 && *p; ++field) {
    fields[field] = std::strtoull(p, nullptr, 10);
    p = std::strchr(p, ' ');
    if (!p) break;
    ++p;
  }
  *pgrp = static_cast<pid_t>(fields[5]);
  *ticks = fields[14] + fields[15] + fields[16] + fields[17];
  return true;
}

// The main thread's bytes written and its wait channel, as one number that changes with either.
uint64_t mainThreadMoves(const std::string& task) {
  char buf[1024];
  uint64_t out = 0;
  if (readProc(task + "/io", buf, sizeof buf))
    if (const char* at = std::strstr(buf, "wchar:")) out = std::strtoull(at + 6, nullptr, 10);
  if (readProc(task + "/wchan", buf, sizeof buf))
    for (const char* c = buf; *c; ++c) out = out * 131 + static_cast<unsigned char>(*c);
  return out;
}

}  // namespace

std::vector<int64_t> IdleProbe::sample(const std::vector<pid_t>& groups, int64_t nowNs) {
  std::map<pid_t, uint64_t> activity;
  for (pid_t g : groups) activity[g] = 0;
  if (DIR* proc = ::opendir("/proc")) {
    while (dirent* e = ::readdir(proc)) {
      if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
      const std::string task = std::string("/proc/") + e->d_name + "/task/" + e->d_name;
      pid_t pgrp = 0;
      uint64_t ticks = 0;
      if (!mainThreadStat(task, &pgrp, &ticks)) continue;
      auto it = activity.find(pgrp);
      if (it == activity.end()) continue;
      // Different units, one sum: what matters is whether it changed.
      it->second += ticks * 1000003 + mainThreadMoves(task);
    }
    ::closedir(proc);
  }
  std::vector<int64_t> idle;
  for (pid_t g : groups) {
    Seen& s = seen_[g];
    if (!s.known || s.activity != activity[g]) {
      s.known = true;
      s.activity = activity[g];
      s.changedNs = nowNs;
    }
    idle.push_back(nowNs - s.changedNs);
  }
  return idle;
}

}  // namespace drun::agent::detail

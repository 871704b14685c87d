// EtcdCluster: a private 3-member etcd cluster on loopback ports for one test
// (scripts/etcd/up.sh / down.sh), or the test skips (CTest SKIPPED) where etcd is not installed.
// Each test process gets its own cluster on random ports (a test may kill members).
// Threading: test thread only. Ownership: the destructor stops the members by their PIDs.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "drun/common/test_skip.hpp"

namespace drun::test {

class EtcdCluster {
 public:
  // tls: https with a throw-away CA (caFile()). placement: environment assignments for up.sh
  // that put the members on namespace hosts (MEMBER_NETNS=.. MEMBER_ADDRS=..; see up.sh).
  explicit EtcdCluster(bool tls = false, const std::string& placement = "") {
    std::random_device rd;
    for (int attempt = 0; attempt < 3; ++attempt) {
      const int base = 20000 + int(rd() % 2000) * 6;
      // OWNER_PID: the cluster is stopped when this process ends, whether or not it ran ~EtcdCluster
      // (a crash, a sanitizer's abort, ctest's timeout).
      const std::string command = placement + " " + std::string(tls ? "TLS=1 " : "") + "BASE_PORT=" +
                                  std::to_string(base) + " OWNER_PID=" + std::to_string(::getpid()) + " " +
                                  script("up.sh") + " 2>&1";
      std::string output;
      FILE* pipe = ::popen(command.c_str(), "r");
      if (!pipe) skipTest("cannot run scripts/etcd/up.sh");
      char buf[512];
      while (std::fgets(buf, sizeof buf, pipe)) output += buf;
      const int status = ::pclose(pipe);
      if (WIFEXITED(status) && WEXITSTATUS(status) == kSkipReturnCode)
        skipTest("etcd is not installed: " + output);
      if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        std::istringstream line(output.substr(output.rfind('\n', output.size() - 2) + 1));
        std::string list;
        line >> dir_ >> list;
        std::istringstream items(list);
        for (std::string item; std::getline(items, item, ',');) endpoints_.push_back(item);
        if (endpoints_.size() == 3) return;
      }
    }
    skipTest("the etcd cluster did not come up (ports taken?)");
  }
  ~EtcdCluster() {
    if (!dir_.empty()) (void)std::system((script("down.sh") + " " + dir_ + " >/dev/null 2>&1").c_str());
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  const std::vector<std::string>& endpoints() const { return endpoints_; }
  std::string caFile() const { return dir_ + "/tls/ca.pem"; }
  std::string memberCertificate() const { return dir_ + "/tls/member.pem"; }
  std::string list() const {
    std::string out;
    for (const auto& e : endpoints_) out += (out.empty() ? "" : ",") + e;
    return out;
  }
  // SIGKILLs member i (0..2) by the PID up.sh recorded, and returns once it has exited (its
  // listening socket closed): a test that calls right after a kill must meet a dead member, not
  // one the kernel has not finished tearing down (a put there can time out instead of being
  // refused, most under TSan). Bounded: 5 s.
  void kill(int member) {
    const pid_t pid = memberPid(member);
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (alive(pid) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Sends `sig` to member i (0..2): SIGSTOP freezes it (its sockets stay open, nothing answers),
  // SIGCONT resumes it.
  void signal(int member, int sig) {
    const pid_t pid = memberPid(member);
    if (pid > 0) ::kill(pid, sig);
  }
  // The member that leads now (0..2), asked through each member's /v3/maintenance/status;
  // -1 when none answers as leader.
  int leader() const {
    for (int i = 0; i < 3; ++i) {
      const std::string command = "curl -s -m 2 -X POST http://" + endpoints_[i] +
                                  "/v3/maintenance/status -d '{}' 2>/dev/null";
      std::string reply;
      if (FILE* pipe = ::popen(command.c_str(), "r")) {
        char buf[1024];
        while (std::fgets(buf, sizeof buf, pipe)) reply += buf;
        ::pclose(pipe);
      }
      auto field = [&](const std::string& name) {
        const size_t at = reply.find("\"" + name + "\":\"");
        if (at == std::string::npos) return std::string();
        const size_t start = at + name.size() + 4;
        return reply.substr(start, reply.find('"', start) - start);
      };
      if (!field("member_id").empty() && field("member_id") == field("leader")) return i;
    }
    return -1;
  }
  void killAll() {
    for (int i = 0; i < 3; ++i) kill(i);
  }

 private:
  // Not yet exited: /proc/<pid> exists and is not a zombie (the members are not our children, and
  // whoever reaps them may take its time; a zombie holds no sockets).
  static bool alive(pid_t pid) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string text;
    if (!std::getline(stat, text)) return false;
    const size_t paren = text.rfind(')');
    return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] != 'Z';
  }
  // Member i's PID as up.sh recorded it (0: none).
  pid_t memberPid(int member) const {
    std::ifstream in(dir_ + "/m" + std::to_string(member) + ".pid");
    pid_t pid = 0;
    return (in >> pid) && pid > 0 ? pid : 0;
  }
  static std::string script(const char* name) {
    return std::string(DRUN_SOURCE_DIR) + "/scripts/etcd/" + name;
  }
  std::string dir_;
  std::vector<std::string> endpoints_;
};

}  // namespace drun::test

// A throw-away cluster of "hosts" made of network namespaces (scripts/netns.sh), for the
// multi-node end-to-end tests: each host has its own address (10.231.0.<i+1>) and loopback, and
// the hosts reach each other through a bridge; nothing touches the machine's own networks.
//
// Needs root and `ip netns`; unavailableReason() says why not, so tests can skip clearly.
// Ownership: the constructor creates the namespaces (prefix unique to this process and
// cluster), the destructor removes them. Threading: one test thread.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace drun::test {

class NetnsCluster {
 public:
  // nullopt when namespaces can be made here, else why not (for the skip message).
  static std::optional<std::string> unavailableReason();

  explicit NetnsCluster(int hosts);  // throws std::runtime_error with the script's output
  ~NetnsCluster();
  NetnsCluster(const NetnsCluster&) = delete;
  NetnsCluster& operator=(const NetnsCluster&) = delete;

  int size() const { return hosts_; }
  std::string address(int host) const;  // "10.231.0.<host+1>"
  std::string namespaceName(int host) const;  // for `ip netns exec` (scripts/etcd/up.sh)
  // argv that runs `argv` inside host `host` (same PID: ip netns exec execs it).
  std::vector<std::string> exec(int host, const std::vector<std::string>& argv) const;

 private:
  std::string prefix_;
  int hosts_ = 0;
};

// Namespaces cannot be made here (not root, no `ip netns`): CTest reports the test SKIPPED,
// saying which (`what`) and why.
void skipWithoutNetns(const std::string& what);

}  // namespace drun::test

#include "netns.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "drun/common/test_skip.hpp"
#include "process.hpp"

namespace drun::test {
namespace {

std::string script() {
  // The test binaries are compiled with the source tree's path (drun_add_tests).
  return (std::filesystem::path(DRUN_SOURCE_DIR) / "scripts" / "netns.sh").string();
}

RunResult netns(std::vector<std::string> args) {
  RunOptions o;
  o.argv = {"/bin/bash", script()};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.timeout = 20s;
  return run(o);
}

}  // namespace

std::optional<std::string> NetnsCluster::unavailableReason() {
  if (::geteuid() != 0) return "needs root (network namespaces)";
  if (!std::filesystem::exists(script())) return "scripts/netns.sh not found at " + script();
  RunOptions o;
  o.argv = {"/bin/sh", "-c", "ip netns list"};
  o.timeout = 10s;
  if (auto r = run(o); r.status() != 0) return "`ip netns` is not available: " + r.err;
  return std::nullopt;
}

NetnsCluster::NetnsCluster(int hosts) : hosts_(hosts) {
  static std::atomic<int> counter{0};
  prefix_ = "drun-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  auto r = netns({"-p", prefix_, "up", std::to_string(hosts)});
  if (r.status() != 0) {
    netns({"-p", prefix_, "down"});
    throw std::runtime_error("netns.sh up " + std::to_string(hosts) + " failed: " + r.describe());
  }
}

NetnsCluster::~NetnsCluster() { netns({"-p", prefix_, "down"}); }

std::string NetnsCluster::address(int host) const {
  return "10.231.0." + std::to_string(host + 1);
}

std::string NetnsCluster::namespaceName(int host) const {
  return prefix_ + "-" + std::to_string(host);  // scripts/netns.sh's naming
}

std::vector<std::string> NetnsCluster::exec(int host, const std::vector<std::string>& argv) const {
  std::vector<std::string> out = {"/bin/bash", script(), "-p", prefix_, "exec",
                                  std::to_string(host)};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

void skipWithoutNetns(const std::string& what) {
  if (auto why = NetnsCluster::unavailableReason()) skipTest(what + ": " + *why);
}

}  // namespace drun::test

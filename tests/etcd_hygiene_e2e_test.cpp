// What a job leaves in etcd and what reading it costs (drun with --rdzv-backend etcd on a
// private 3-member cluster, scripts/etcd/up.sh; SKIPPED without etcd): an ended job's keys go
// (those `drun status` reads after a TTL of their own), a cluster without a quorum is named so
// in the agents' and drun status's errors, and drun status grants no lease.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <thread>

#include "../rendezvous/etcd/tests/etcd_cluster.hpp"
#include "process.hpp"

using namespace drun::test;
using namespace std::chrono_literals;

namespace {

// The argv of an agent of a `nnodes` job on `etcd` (lease TTL 3 s), with more --rdzv-conf.
std::vector<std::string> hygieneAgent(const EtcdCluster& etcd, const std::string& id, const std::string& conf,
                                      std::vector<std::string> program) {
  std::vector<std::string> args = {"--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "etcd",
                                   "--rdzv-endpoint", etcd.list(), "--rdzv-id", id, "--rdzv-conf",
                                   "heartbeat_timeout=3,join_timeout=20,last_call_timeout=0" + conf};
  args.insert(args.end(), program.begin(), program.end());
  return args;
}

// `command`'s stdout (bounded: curl and etcdctl are given timeouts of their own).
std::string shellOutput(const std::string& command) {
  RunOptions o;
  o.argv = {"/bin/sh", "-c", command};
  o.timeout = 20s;
  const RunResult r = run(o);
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  return r.out;
}

// Every key under the prefix, with its lease (0: none), as etcdctl lists them.
std::vector<std::pair<std::string, int64_t>> keysUnder(const EtcdCluster& etcd, const std::string& prefix) {
  const auto reply = nlohmann::json::parse(shellOutput(
      "ETCDCTL_API=3 etcdctl --command-timeout=5s --endpoints=" + etcd.list() + " get --prefix '" + prefix +
      "' -w json"));
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& kv : reply.value("kvs", nlohmann::json::array()))
    out.emplace_back(kv.value("key", ""), kv.value("lease", int64_t{0}));  // key in base64
  return out;
}

// The leases the cluster granted so far (every member applies each grant: any one that answers).
int64_t leasesGranted(const EtcdCluster& etcd) {
  for (const std::string& member : etcd.endpoints()) {
    const std::string metrics = shellOutput("curl -s -m 5 http://" + member + "/metrics || true");
    const std::string name = "\netcd_debugging_lease_granted_total ";
    const size_t at = metrics.find(name);
    if (at != std::string::npos) return std::stoll(metrics.substr(at + name.size()));
  }
  FAIL("no etcd member served /metrics");
  return -1;
}

RunResult drunStatus(const EtcdCluster& etcd, const std::string& id) {
  return run(drunCommand({"status", "--rdzv-backend", "etcd", "--rdzv-endpoint", etcd.list(), "--rdzv-id", id,
                          "--json", "--timeout", "5s"},
                         {}, 30s));
}

void twoAgentsSucceed(const EtcdCluster& etcd, const std::string& id, const std::string& conf) {
  MarkerScope marker;
  const std::vector<std::string> program = {"sh", "-c", "echo RANK=$RANK"};
  Process a(drunCommand(hygieneAgent(etcd, id, conf, program), {marker.env()}, 40s));
  Process b(drunCommand(hygieneAgent(etcd, id, conf, program), {marker.env()}, 40s));
  const RunResult ra = a.wait(), rb = b.wait();
  INFO(ra.describe() << "\n" << rb.describe());
  REQUIRE(ra.status() == 0);
  REQUIRE(rb.status() == 0);
}

}  // namespace

TEST_CASE("etcd hygiene: an ended job's keys are removed: what drun status reads lives on a lease "
          "that ends after etcd_history_ttl", "[e2e][etcd]") {
  EtcdCluster etcd;
  const std::string id = "etcd-clean-" + randomHex(6);
  twoAgentsSucceed(etcd, id, ",etcd_history_ttl=3s");
  // Right after the end: the outcome and history are still there for drun status, each key on
  // a lease; nothing else of the job (rounds, wills, retry tokens) is left.
  const auto left = keysUnder(etcd, "/drun/");
  CHECK_FALSE(left.empty());
  for (const auto& [key, lease] : left) {
    INFO("key (base64) " << key);
    CHECK(lease != 0);
  }
  const RunResult status = drunStatus(etcd, id);
  INFO(status.describe());
  REQUIRE(status.status() == 0);
  CHECK(nlohmann::json::parse(status.out)["state"] == "succeeded");
  // After the TTL (3 s; etcd ends an expired lease within about a second more): nothing.
  const auto until = std::chrono::steady_clock::now() + 15s;
  while (!keysUnder(etcd, "/drun/").empty() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(250ms);
  CHECK(keysUnder(etcd, "/drun/").empty());
}

TEST_CASE("etcd hygiene: drun status grants no lease, and reads a job while etcd has no quorum",
          "[e2e][etcd]") {
  EtcdCluster etcd;
  const std::string id = "etcd-readonly-" + randomHex(6);
  twoAgentsSucceed(etcd, id, "");
  const int64_t before = leasesGranted(etcd);
  for (int i = 0; i < 2; ++i) {
    const RunResult status = drunStatus(etcd, id);
    INFO(status.describe());
    REQUIRE(status.status() == 0);
    CHECK(nlohmann::json::parse(status.out)["state"] == "succeeded");
  }
  CHECK(leasesGranted(etcd) == before);
  // Two of three members gone: no leader, no quorum. The last one still answers reads.
  etcd.kill(0);
  etcd.kill(1);
  const RunResult alone = drunStatus(etcd, id);
  INFO(alone.describe());
  REQUIRE(alone.status() == 0);
  CHECK(nlohmann::json::parse(alone.out)["state"] == "succeeded");
}

TEST_CASE("etcd hygiene: a cluster that lost its quorum under a running job: the agents' errors "
          "say so in words", "[e2e][etcd]") {
  EtcdCluster etcd;
  MarkerScope marker;
  TempDir dir;
  const std::string id = "etcd-quorum-" + randomHex(6);
  // Workers that run until the agents stop them (bounded: 30 s).
  const std::vector<std::string> program = {"sh", "-c", "echo READY; i=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"};
  Process a(drunCommand(hygieneAgent(etcd, id, ",reconnect_timeout=2", program), {marker.env()}, 40s));
  Process b(drunCommand(hygieneAgent(etcd, id, ",reconnect_timeout=2", program), {marker.env()}, 40s));
  REQUIRE(a.waitForLines("READY", 1, 20s));
  REQUIRE(b.waitForLines("READY", 1, 20s));
  etcd.kill(1);
  etcd.kill(2);
  const RunResult ra = a.wait(30s), rb = b.wait(30s);
  INFO(ra.describe() << "\n" << rb.describe());
  for (const RunResult* r : {&ra, &rb}) {
    CHECK_FALSE(r->timedOut);
    CHECK(r->status() != 0);
    CHECK_THAT(r->err, Catch::Contains("etcd has no quorum"));
  }
  CHECK(marker.leftovers(5s).empty());
}

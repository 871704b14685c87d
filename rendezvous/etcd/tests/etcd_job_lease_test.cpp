// The job lease (EtcdStoreOptions::jobLeaseTtl): the keys of a job whose agents all died without
// leaving (nobody ran a will, nobody moved the keys to an ended job's lease) end with it.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "../src/etcd_session.hpp"
#include "etcd_test_options.hpp"

using namespace drun::rdzv;
using namespace std::chrono_literals;

namespace {

// A child process: an agent of job `scope` that writes what a join writes (a set, a +-1 add, an
// append, a will), says so on `ready` and waits to be killed (at most 60 s).
pid_t spawnAgent(const EtcdStoreOptions& options, int ready) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  int status = 0;
  try {
    EtcdStore store(openEtcdSession(options));
    store.set("rdzv/job1/0/state", "decided");
    store.add("rdzv/job1/0/count", 1);
    store.append("rdzv/job1/0/joined", "node\n");
    store.setWill({{{"rdzv/job1/0/status", "lost"}}, {{"rdzv/job1/present", -1}}, {}});
    const char one = 1;
    if (::write(ready, &one, 1) != 1) status = 2;
    std::this_thread::sleep_for(60s);
  } catch (...) {
    status = 3;
  }
  ::_exit(status);
}

}  // namespace

TEST_CASE("etcd store: the keys of a job whose agents were all SIGKILLed end within the job "
          "lease's TTL",
          "[etcd]") {
  drun::test::EtcdCluster cluster;
  EtcdStoreOptions options = drun::test::etcdStoreOptions(cluster, "job1");
  options.jobLeaseTtl = 3s;
  EtcdClient reader(drun::test::etcdClientOptions(cluster.endpoints()));
  auto keysLeft = [&] { return reader.range(options.prefix, EtcdClient::prefixEnd(options.prefix)).kvs; };
  std::vector<pid_t> agents;
  int ready = 0;
  for (int i = 0; i < 2; ++i) {
    int pipeFds[2];
    REQUIRE(::pipe(pipeFds) == 0);
    agents.push_back(spawnAgent(options, pipeFds[1]));
    ::close(pipeFds[1]);
    char byte = 0;
    ready += ::read(pipeFds[0], &byte, 1) == 1;
    ::close(pipeFds[0]);
  }
  const auto before = keysLeft();
  for (const pid_t pid : agents) {
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
  // Both agents' keys were there, each bound to a lease (the job's, or a session's own).
  REQUIRE(ready == 2);
  REQUIRE(before.size() >= 6);
  for (const EtcdKeyValue& kv : before) {
    INFO(kv.key);
    CHECK(kv.lease != 0);
  }
  // Nobody renews the job lease now: etcd ends it after its 3 s TTL (within about a second
  // more), and every key with it. Bounded: 15 s.
  const auto until = std::chrono::steady_clock::now() + 15s;
  while (!keysLeft().empty() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(250ms);
  const auto after = keysLeft();
  for (const EtcdKeyValue& kv : after) INFO("left: " << kv.key);
  CHECK(after.empty());
}

TEST_CASE("etcd store: the job lease outlives an agent while another of the job renews it", "[etcd]") {
  drun::test::EtcdCluster cluster;
  EtcdStoreOptions options = drun::test::etcdStoreOptions(cluster, "job2");
  options.jobLeaseTtl = 3s;
  auto first = openEtcdSession(options);
  auto second = openEtcdSession(options);
  CHECK(first->jobLease() != 0);
  CHECK(first->jobLease() == second->jobLease());
  {
    EtcdStore store(first);
    store.set("rdzv/job2/config", "x");
  }
  first.reset();
  // Three TTLs later the key is still there: the second session renewed the lease.
  std::this_thread::sleep_for(9s);
  EtcdStore store(second);
  CHECK(store.tryGet("rdzv/job2/config") == std::optional<std::string>("x"));
}

// Hostile clients against a drun-rendezvous daemon: a crowd of connections from the job's own
// address, then the job (hostile_client_test.cpp says more).
#include <sys/resource.h>

#include <memory>

#include <catch2/catch.hpp>
#include <csignal>
#include <string>
#include <vector>

#include "drun/common/test_skip.hpp"
#include "hostile_clients.hpp"
#include "process.hpp"

using namespace drun::test;
using namespace drun::test::hostile;
using namespace std::chrono_literals;

// 1,400 connections that never say hello, 50 that send garbage and 50 stalled in the
// middle of a frame, all from 127.0.0.1, then a real two-node job from 127.0.0.1 on the same
// daemon. Connections before their hello have a cap of their own (the oldest is dropped for a
// newcomer) and a 3 s deadline; the connection caps count admitted connections only.
namespace {

void crowdThenJob(const std::vector<std::string>& daemonArgs, const std::string& conf,
                  const std::string& what) {
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  if (files.rlim_max < 4096) drun::test::skipTest("needs 4096 file descriptors (ulimit -Hn)");
  files.rlim_cur = files.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &files);  // 1,500 sockets here, as many in the daemon
  MarkerScope marker;
  Daemon daemon(daemonArgs);
  std::vector<std::unique_ptr<Raw>> crowd;
  int connected = 0;
  for (int i = 0; i < 1400; ++i) crowd.push_back(std::make_unique<Raw>(daemon.port));  // silent
  for (int i = 0; i < 50; ++i) {
    crowd.push_back(std::make_unique<Raw>(daemon.port));
    crowd.back()->send(randomBytes(256));
  }
  for (int i = 0; i < 50; ++i) {
    crowd.push_back(std::make_unique<Raw>(daemon.port));
    crowd.back()->send(helloBytes() + requestBytes(wire::Op::Get, 1, "hostile/x", 1000).substr(0, 9));
  }
  for (auto& c : crowd) connected += c->connected();
  CHECK(connected == 1500);
  // At once, while the crowd is there (its idle part would be gone after the 3 s deadline).
  JobResult job = runJob(daemon.port, "crowd-" + randomHex(6), conf, marker);
  checkJobSucceeded(job);
  int closedByDaemon = 0;
  for (auto& c : crowd) closedByDaemon += c->closedByPeer(1ms);
  report("1400 silent + 50 garbage + 50 mid-frame from 127.0.0.1, " + what,
         "job exit " + std::to_string(job.a.status()) + " / " + std::to_string(job.b.status()) +
             "; " + std::to_string(closedByDaemon) + " of the crowd closed by the daemon by then");
  CHECK(marker.leftovers(5s).empty());
  crowd.clear();
  daemon.process->signal(SIGTERM);
  CHECK(daemon.process->wait(10s).status() == 0);
}

}  // namespace

TEST_CASE("hostile clients: a crowd from the job's own address does not keep an open store's job out",
          "[e2e][hostile][admission]") {
  crowdThenJob({}, "is_host=0,join_timeout=20", "open store");
}

TEST_CASE("hostile clients: a crowd from the job's own address does not keep a token store's job out",
          "[e2e][hostile][admission]") {
  TempDir dir;
  const std::string token = randomHex(48);
  auto tokenFile = dir.write("token", token + "\n");
  crowdThenJob({"--token-file", tokenFile.string()},
               "is_host=0,join_timeout=20,token_file=" + tokenFile.string(), "token store");
}

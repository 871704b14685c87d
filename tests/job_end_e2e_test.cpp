// End-to-end tests of drun's processes and command line: no daemon outlives the job
// (even one that left the worker's session and cleared its environment), abandoned temporary
// trees are removed, `ulimit -n` does not end a large job, the last of a repeated option wins,
// and --log-dir naming a file is a usage error.
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>
#include <utime.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <thread>

#include "process.hpp"

namespace fs = std::filesystem;
using namespace drun::test;
using namespace std::chrono_literals;

namespace {

// True when `pid` runs `program` (its cmdline's first word), so the test never signals a reused
// pid.
bool runs(pid_t pid, const std::string& program) {
  std::string cmdline = slurp("/proc/" + std::to_string(pid) + "/cmdline");
  return cmdline.rfind(program + '\0', 0) == 0;
}

bool gone(pid_t pid) {
  std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');
  return stat.empty() || (close != std::string::npos && stat[close + 2] == 'Z');
}

}  // namespace

TEST_CASE("job end: a daemon that called setsid and cleared its environment does not outlive drun",
          "[e2e]") {
  MarkerScope marker;
  TempDir dir;
  const std::string pidFile = (dir / "daemon.pid").string();
  // setsid + a background child whose parent exits at once (a double fork), env -i: neither the
  // worker's process group nor the job's marker finds it.
  std::vector<std::string> worker = {
      "/bin/sh", "-c",
      "setsid /bin/sh -c 'env -i /bin/sleep 300 </dev/null >/dev/null 2>&1 & echo $! > " + pidFile + "'"};
  SECTION("sh: setsid, &, env -i") {}
  SECTION("Python: fork, setsid, fork, exec with an empty environment") {
    worker = {"/usr/bin/python3", "-c",
              "import os\n"
              "if os.fork() == 0:\n"
              "    os.setsid()\n"
              "    pid = os.fork()\n"
              "    if pid == 0:\n"
              "        os.execve('/bin/sleep', ['/bin/sleep', '300'], {})\n"
              "    open('" + pidFile + "', 'w').write(str(pid))\n"
              "    os._exit(0)\n"
              "os.wait()\n"};
  }
  auto r = run(drunCommand(worker, {marker.env()}));
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  std::string text = slurp(pidFile);
  REQUIRE_FALSE(text.empty());
  const pid_t daemon = static_cast<pid_t>(std::stol(text));
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!gone(daemon) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);  // polling /proc: no event for another process's end
  const bool survived = !gone(daemon);
  if (survived && runs(daemon, "/bin/sleep")) ::kill(daemon, SIGKILL);  // ours: clean up
  CHECK_FALSE(survived);
}

TEST_CASE("job end: a start removes the empty trees of SIGKILLed druns and nothing else",
          "[e2e]") {
  MarkerScope marker;
  TempDir tmp;
  auto make = [&](const std::string& name) {
    fs::create_directories(tmp / name / "node0" / "attempt_0" / "0");
    return tmp / name;
  };
  auto backdate = [](const fs::path& p) {  // abandoned a minute ago
    struct utimbuf old{::time(nullptr) - 60, ::time(nullptr) - 60};
    ::utime(p.c_str(), &old);
  };
  fs::path abandoned = make("drun_Ab12Cd");
  fs::path withFile = make("drun_Ef34Gh");
  std::ofstream(withFile / "node0" / "attempt_0" / "0" / "error.json") << "{}";
  fs::path running = make("drun_Ij56Kl");  // a live drun holds its lock
  fs::path fresh = make("drun_Mn78Op");    // just made: maybe not locked yet
  fs::path other = make("other_Qr90St");
  for (auto& p : {abandoned, withFile, running, other}) backdate(p);
  int lock = ::open(running.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(lock >= 0);
  REQUIRE(::flock(lock, LOCK_EX | LOCK_NB) == 0);

  auto r = run(drunCommand({"/bin/true"}, {marker.env(), "TMPDIR=" + tmp.path().string()}));
  ::close(lock);
  INFO(r.describe());
  CHECK(r.status() == 0);
  CHECK_FALSE(fs::exists(abandoned));
  CHECK(fs::exists(withFile));
  CHECK(fs::exists(running));
  CHECK(fs::exists(fresh));
  CHECK(fs::exists(other));
  // drun's own temporary tree went at exit.
  size_t left = 0;
  for (auto& e : fs::directory_iterator(tmp.path())) left += e.path().filename().string().rfind("drun_", 0) == 0;
  CHECK(left == 3);  // withFile, running, fresh
}

TEST_CASE("job end: ulimit -n 64 does not stop 40 workers, and they keep the user's limit", "[e2e]") {
  MarkerScope marker;
  RunOptions options;
  options.argv = {"/bin/sh", "-c", "ulimit -Sn 64 && exec \"$0\" \"$@\"", drunPath().string(),
                  "--nproc-per-node", "40", "/bin/sh", "-c", "ulimit -Sn"};
  options.env = {marker.env(), "OMP_NUM_THREADS=1"};
  options.timeout = 60s;
  auto r = run(options);
  INFO(r.describe());
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 0);
  size_t limits = 0;
  for (auto& l : parseConsole(r.out)) limits += l.text == "64";
  CHECK(limits == 40);
}

TEST_CASE("command line: an option given twice, the last one wins (as argparse)", "[e2e]") {
  MarkerScope marker;
  auto r = run(drunCommand({"--nproc_per_node=2", "--nproc-per-node=3", "--max-restarts", "1",
                            "--max_restarts", "0", helperPath("env_dump").string()},
                           {marker.env(), "OMP_NUM_THREADS=1"}));
  INFO(r.describe());
  REQUIRE(r.status() == 0);
  auto dumps = parseEnvDumps(r.out);
  CHECK(dumps.size() == 3);
  if (!dumps.empty()) CHECK(dumps.begin()->second.get("TORCHELASTIC_MAX_RESTARTS") == "0");
}

TEST_CASE("command line: --log-dir naming a file is a usage error that names the option", "[e2e]") {
  TempDir dir;
  auto file = dir.write("not-a-dir", "x");
  for (auto path : {file, file / "below"}) {
    auto r = run(drunCommand({"--log-dir", path.string(), "/bin/true"}));
    INFO(r.describe());
    CHECK(r.status() == 2);
    CHECK(contains(r.err, "drun: error: --log-dir"));
    CHECK(contains(r.err, "not a directory"));
  }
}

TEST_CASE("log files: a stalled --log-dir file does not stop drun's signal handling", "[e2e]") {
  MarkerScope marker;
  TempDir dir;
  // rank 0's stdout.log is a FIFO the test opens and never reads: a write to it blocks, as one
  // to a stalled network file system does.
  fs::path rankDir = dir / "stall" / "node0" / "attempt_0" / "0";
  fs::create_directories(rankDir);
  fs::path fifo = rankDir / "stdout.log";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  REQUIRE(reader >= 0);
  Process job(drunCommand({"--log-dir", dir.path().string(), "--rdzv-id", "stall", "/bin/sh", "-c",
                           "head -c 1000000 /dev/zero | tr '\\0' x; echo; echo READY; sleep 60"},
                          {marker.env()}));
  const bool ready = job.waitForLines("READY", 1, 10s);  // past the FIFO's 64 KiB
  job.signal(SIGTERM);
  auto r = job.wait(15s);
  ::close(reader);
  INFO(r.describe());
  CHECK(ready);
  REQUIRE_FALSE(r.timedOut);
  CHECK(r.status() == 143);
  CHECK(marker.leftovers(5s).empty());
}

TEST_CASE("command line: the static backend says that a node ends without waiting for the others",
          "[e2e]") {
  MarkerScope marker;
  auto r = run(drunCommand({"--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
                            "--master-port", std::to_string(freeLoopbackPort()), "/bin/true"},
                           {marker.env()}));
  INFO(r.describe());
  CHECK(r.status() == 0);
  CHECK_FALSE(contains(r.err, "waiting for the other"));
  CHECK(contains(r.err, "each node ends on its own"));
}

TEST_CASE("command line: a script without #! gets a hint with its Exec format error", "[e2e]") {
  MarkerScope marker;
  TempDir dir;
  auto script = dir.write("job.sh", "echo hello\n", fs::perms::owner_all);
  auto r = run(drunCommand({script.string()}, {marker.env()}));
  INFO(r.describe());
  CHECK(r.status() == 126);
  CHECK(contains(r.err, "Exec format error"));
  CHECK(contains(r.err, "#!/bin/sh"));
}

TEST_CASE("command line: every line drun writes itself starts with 'drun:', debug lines too",
          "[e2e]") {
  MarkerScope marker;
  auto r = run(drunCommand({"-v", "--nproc-per-node", "2", "/bin/true"}, {marker.env()}));
  INFO(r.describe());
  CHECK(r.status() == 0);
  size_t lines = 0;
  for (const auto& line : splitLines(r.err)) {
    INFO(line);
    CHECK(line.rfind("drun: ", 0) == 0);
    ++lines;
  }
  CHECK(lines > 3);  // -v: the agent's transitions at least
}

// The rendezvous store's token as users meet it: a job given a token file runs (its
// workers get DRUN_RDZV_TOKEN_FILE for their comm bootstrap); an agent with a wrong token, or none,
// is refused with a clear error and the server logs the refusal; a token file others can read is
// refused before anything starts.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "process.hpp"

using namespace drun::test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> job(uint16_t port, const std::string& id, int nnodes,
                             const std::string& conf, std::vector<std::string> program) {
  std::vector<std::string> args = {"--nnodes", std::to_string(nnodes), "--nproc-per-node", "1",
                                   "--rdzv-endpoint", "127.0.0.1:" + std::to_string(port),
                                   "--rdzv-id", id, "--rdzv-conf", conf};
  args.insert(args.end(), program.begin(), program.end());
  return args;
}

// Two agents of one job started together, both run to the end.
std::pair<RunResult, RunResult> runTwo(const std::vector<std::string>& args) {
  Process a(drunCommand(args, {}, 30s));
  Process b(drunCommand(args, {}, 30s));
  RunResult ra = a.wait();
  return {ra, b.wait()};
}

}  // namespace

TEST_CASE("access: a job with a token runs and a wrong or missing token is refused and logged",
          "[e2e][rendezvous]") {
  TempDir dir;
  const fs::path token = dir.write("token", "correct-token-0123456789abcdef\n");
  const fs::path wrong = dir.write("wrong", "another-token-0123456789abcdef\n");
  Process daemon(RunOptions{{(buildDir() / "bin" / "drun-rendezvous").string(), "--host",
                             "127.0.0.1", "--port", "0", "--token-file", token.string()},
                            {}, {}, 60s});
  std::string out;
  REQUIRE(daemon.waitForOutput(
      [&](const std::string& o, const std::string&) {
        out = o;
        return o.find("listening on") != std::string::npos && o.find('\n') != std::string::npos;
      },
      10s));
  const uint16_t port = static_cast<uint16_t>(std::stoi(out.substr(out.rfind(':') + 1)));
  const std::string id = "token-" + randomHex(6);

  // Two agents with the token: the job runs; the workers are told the token file.
  const std::string conf = "is_host=0,join_timeout=20s,token_file=" + token.string();
  std::vector<std::string> program = {"sh", "-c", "echo RANK=$RANK TOKEN=$DRUN_RDZV_TOKEN_FILE"};
  auto [ra, rb] = runTwo(job(port, id, 2, conf, program));
  INFO(ra.describe() << "\n" << rb.describe());
  CHECK(ra.status() == 0);
  CHECK(rb.status() == 0);
  CHECK_THAT(ra.out + rb.out, Catch::Contains("TOKEN=" + token.string()));

  // A wrong token: refused, named; nothing joins.
  RunResult w = run(drunCommand(
      job(port, "other-" + randomHex(6), 1, "is_host=0,token_file=" + wrong.string(), {"/bin/true"}),
      {}, 30s));
  INFO(w.describe());
  CHECK(w.status() == 1);
  CHECK_THAT(w.err, Catch::Contains("refused this client's token"));
  // No token at all: told what to give.
  RunResult none = run(drunCommand(
      job(port, "other-" + randomHex(6), 1, "is_host=0", {"/bin/true"}), {}, 30s));
  INFO(none.describe());
  CHECK(none.status() == 1);
  CHECK_THAT(none.err, Catch::Contains("requires a token"));
  CHECK_THAT(none.err, Catch::Contains("token_file"));

  // The tokenless client's close reaches the server after that client has exited: wait for the
  // server to see it, since a stopping server does not log connections it drops itself.
  CHECK(daemon.waitForOutput(
      [](const std::string&, const std::string& e) {
        return e.find("left without proving the token") != std::string::npos;
      },
      10s));
  daemon.signal(SIGTERM);
  RunResult d = daemon.wait(10s);
  INFO(d.describe());
  CHECK(d.status() == 0);
  CHECK_THAT(d.err, Catch::Contains("refused 127.0.0.1"));
  CHECK_THAT(d.err, Catch::Contains("wrong token"));
  CHECK_THAT(d.err, Catch::Contains("left without proving the token"));
}

TEST_CASE("access: the embedded store takes the token and a readable token file is refused",
          "[e2e][rendezvous]") {
  TempDir dir;
  const fs::path token = dir.write("token", "embedded-token-0123456789abcdef");
  const uint16_t port = freeLoopbackPort();
  const std::string conf = "join_timeout=20s,token_file=" + token.string();
  std::vector<std::string> program = {"sh", "-c", "echo RANK=$RANK"};
  const std::string id = "embedded-" + randomHex(6);
  auto [ra, rb] = runTwo(job(port, id, 2, conf, program));
  INFO(ra.describe() << "\n" << rb.describe());
  CHECK(ra.status() == 0);
  CHECK(rb.status() == 0);
  CHECK_THAT(ra.out + rb.out, Catch::Contains("RANK=1"));

  // The same through the environment, with a file its group may read: refused at once.
  const fs::path open = dir.write("open", "readable-token-0123456789abcdef",
                                  fs::perms::owner_read | fs::perms::owner_write |
                                      fs::perms::group_read | fs::perms::others_read);
  RunResult r = run(drunCommand(job(freeLoopbackPort(), "open-" + randomHex(6), 1,
                                    "join_timeout=5s", {"/bin/true"}),
                                {"DRUN_RDZV_TOKEN_FILE=" + open.string()}, 30s));
  INFO(r.describe());
  CHECK(r.status() == 2);  // bad input, like a usage error: nothing started
  CHECK_THAT(r.err, Catch::Contains("chmod 600"));
  CHECK_THAT(r.err, Catch::Contains("DRUN_RDZV_TOKEN_FILE"));
}

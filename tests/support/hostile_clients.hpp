// Helpers of the hostile-client tests (hostile_*_test.cpp): a drun-rendezvous daemon and its
// resources, raw wire clients, the real two-node job that meets beside the attackers, and the
// report lines the tests print.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "drun/common/error.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/store/protocol.hpp"
#include "drun/store/tcp_store.hpp"
#include "process.hpp"

namespace wire = drun::rdzv::wire;
namespace keys = drun::rdzv::keys;

namespace drun::test::hostile {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr size_t kBigValueBytes = 1u << 20;
constexpr int kBigGets = 100;  // 100 MiB of replies: over maxOutputQueueBytes (64 MiB)

// ---- the daemon ---------------------------------------------------------------------------------

inline long vmRssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

inline long openFds(pid_t pid) {
  std::error_code ec;
  long n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec))
    ++n;
  return ec ? -1 : n;
}

struct Daemon {
  std::unique_ptr<Process> process;
  uint16_t port = 0;

  explicit Daemon(std::vector<std::string> extra) {
    std::vector<std::string> argv = {(buildDir() / "bin" / "drun-rendezvous").string(), "--host",
                                     "127.0.0.1", "--port", "0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    process = std::make_unique<Process>(RunOptions{argv, {}, {}, 120s});
    std::string out;
    REQUIRE(process->waitForOutput(
        [&](const std::string& o, const std::string&) {
          out = o;
          return o.find("listening on") != std::string::npos && o.find('\n') != std::string::npos;
        },
        10s));
    auto line = out.substr(0, out.find('\n'));
    port = static_cast<uint16_t>(std::stoi(line.substr(line.rfind(':') + 1)));
  }
  pid_t pid() const { return process->pid(); }
  bool alive() const { return ::kill(process->pid(), 0) == 0 && vmRssKiB(process->pid()) > 0; }
};

// ---- raw wire clients ---------------------------------------------------------------------------

// One TCP connection speaking whatever the attack wants. Closes on destruction.
class Raw {
 public:
  // Connects from `source` (any 127/8 address is this host's loopback) to 127.0.0.1:port.
  Raw(uint16_t port, const char* source = "127.0.0.1", int receiveBuffer = 0) {
    // No Catch2 assertion here: attackers run on threads, and Catch2 v2 is not thread-safe.
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return;
    if (receiveBuffer > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receiveBuffer, sizeof receiveBuffer);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    ::inet_pton(AF_INET, source, &from.sin_addr);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) return;
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0;
  }
  ~Raw() {
    if (fd_ >= 0) ::close(fd_);
  }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;

  bool connected() const { return connected_; }

  // Sends everything (blocking, bounded by the socket's send timeout); false if the peer is gone.
  bool send(const std::string& bytes) {
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

  // Reads until `min` bytes arrived, the peer closed (`peerClosed` set) or `timeout`; what arrived.
  std::string receive(size_t min, std::chrono::milliseconds timeout, bool* peerClosed = nullptr) {
    std::string got;
    const auto deadline = Clock::now() + timeout;
    char buf[4096];
    while (got.size() < min && Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {  // EOF or reset
        if (peerClosed) *peerClosed = true;
        break;
      }
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }

  // Discards whatever arrives until the peer closes (true) or `timeout` passes (false).
  // `drained` counts the bytes read.
  bool closedByPeer(std::chrono::milliseconds timeout, size_t* drained = nullptr) {
    const auto deadline = Clock::now() + timeout;
    std::vector<char> buf(1 << 16);
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
      if (n <= 0) return true;  // EOF or reset
      if (drained) *drained += static_cast<size_t>(n);
    }
    return false;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

inline std::string helloBytes(const std::string& scope = "") {
  wire::Hello hello;
  hello.nonce = wire::randomNonce();
  hello.scope = scope;
  std::string out;
  wire::encodeHello(hello, out);
  return out;
}

inline std::string requestBytes(wire::Op op, uint64_t id, const std::string& key, uint32_t timeoutMs = 0) {
  wire::Request request;
  request.op = op;
  request.id = id;
  request.keys = {key};
  request.timeoutMs = timeoutMs;
  std::string out;
  wire::encodeRequest(request, out);
  return out;
}

// A hello exchange: the server's reply status, or nullopt when no whole reply came.
inline std::optional<wire::HelloStatus> sayHello(Raw& raw) {
  if (!raw.send(helloBytes())) return std::nullopt;
  std::string reply;
  const auto deadline = Clock::now() + 5s;
  while (Clock::now() < deadline) {
    wire::HelloReply decoded;
    auto result = wire::decodeHelloReply(reply, decoded);
    if (result.status == wire::DecodeStatus::Ok) return decoded.status;
    if (result.status == wire::DecodeStatus::Bad) return std::nullopt;
    reply += raw.receive(1, 200ms);
  }
  return std::nullopt;
}

// A hello, then kBigGets gets of the 1 MiB value "hostile/big": what a slow reader sends before it
// stops reading.
inline std::string slowReaderRequests() {
  std::string bytes = helloBytes();
  for (int i = 0; i < kBigGets; ++i)
    bytes += requestBytes(wire::Op::Get, static_cast<uint64_t>(i + 1), "hostile/big", 5000);
  return bytes;
}

inline size_t countOf(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

inline std::string randomBytes(size_t n) {
  std::mt19937 rng(std::random_device{}());
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// ---- the real job -------------------------------------------------------------------------------

struct JobResult {
  RunResult a, b;
  std::string describe() const { return a.describe() + "\n" + b.describe(); }
};

// What a test does while the job's agents run (each when given).
struct JobHooks {
  std::function<void()> betweenAgents;                  // after the first started, before the second
  std::function<void(Process&, Process&)> whileRunning;  // once both started, before they are waited
};

inline JobResult runJob(uint16_t port, const std::string& id, const std::string& conf, const MarkerScope& marker,
                 const JobHooks& hooks = {}) {
  std::vector<std::string> args = {"--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint",
                                   "127.0.0.1:" + std::to_string(port), "--rdzv-id", id,
                                   "--rdzv-conf", conf, "sh", "-c",
                                   "echo RANK=$RANK MASTER=$MASTER_ADDR"};
  Process pa(drunCommand(args, {marker.env()}, 40s));
  if (hooks.betweenAgents) hooks.betweenAgents();
  Process pb(drunCommand(args, {marker.env()}, 40s));
  if (hooks.whileRunning) hooks.whileRunning(pa, pb);
  JobResult job;
  job.a = pa.wait();
  job.b = pb.wait();
  return job;
}

// Ranks and MASTER_ADDR values the workers printed.
inline void parseJob(const std::string& out, std::multiset<int>& ranks, std::set<std::string>& masters) {
  for (const ConsoleLine& line : parseConsole(out)) {
    if (line.text.rfind("RANK=", 0) != 0) continue;
    ranks.insert(std::stoi(line.text.substr(5)));
    auto m = line.text.find("MASTER=");
    if (m != std::string::npos) masters.insert(line.text.substr(m + 7));
  }
}

inline void checkJobSucceeded(const JobResult& job) {
  INFO(job.describe());
  CHECK(!job.a.timedOut);
  CHECK(!job.b.timedOut);
  CHECK(job.a.status() == 0);
  CHECK(job.b.status() == 0);
  std::multiset<int> ranks;
  std::set<std::string> masters;
  parseJob(job.a.out, ranks, masters);
  parseJob(job.b.out, ranks, masters);
  CHECK(ranks == std::multiset<int>{0, 1, 2, 3});
  for (const std::string& m : masters) CHECK(keys::isHostOrAddress(m));
}

// A job whose keys were forged: success, or exit 1 with a clear and bounded error.
inline std::string checkJobEndsCleanly(const JobResult& job) {
  INFO(job.describe());
  std::string outcome;
  for (const RunResult* r : {&job.a, &job.b}) {
    CHECK(!r->timedOut);
    CHECK(r->signal == 0);
    CHECK((r->status() == 0 || r->status() == 1));
    if (r->status() == 1) {
      CHECK_THAT(r->err, Catch::Contains("drun: error:"));
      CHECK(r->err.size() < 64 * 1024);                         // a forged 1 MiB error is not echoed
      CHECK(r->err.find('\x1b') == std::string::npos);          // nor its escape sequences
    }
    std::multiset<int> ranks;
    std::set<std::string> masters;
    parseJob(r->out, ranks, masters);
    for (const std::string& m : masters) {
      CHECK(keys::isHostOrAddress(m));
      CHECK(m.find("evil") == std::string::npos);
    }
    outcome += (outcome.empty() ? "" : " / ") + std::string("exit ") + std::to_string(r->status());
    auto error = r->err.find("drun: error:");
    if (error != std::string::npos)
      outcome += " (" + r->err.substr(error, std::min<size_t>(160, r->err.find('\n', error) - error)) + ")";
  }
  if (job.a.status() == 0 && job.b.status() == 0) {
    std::multiset<int> ranks;
    std::set<std::string> masters;
    parseJob(job.a.out, ranks, masters);
    parseJob(job.b.out, ranks, masters);
    CHECK(ranks == std::multiset<int>{0, 1, 2, 3});
  }
  return outcome;
}

inline drun::rdzv::TcpStoreOptions storeOptions(uint16_t port, const std::string& token = "",
                                         const std::string& scope = "") {
  drun::rdzv::TcpStoreOptions o;
  o.endpoint.port = port;
  o.connectTimeout = 5s;
  o.timeout = 10s;
  o.token = token;
  o.scope = scope;
  return o;
}

inline void report(const std::string& attack, const std::string& outcome) {
  std::cout << "hostile: | " << attack << " | " << outcome << " |" << std::endl;
}

// Runs the wire attacks beside the real job; checks them and the daemon's resources.

}  // namespace drun::test::hostile

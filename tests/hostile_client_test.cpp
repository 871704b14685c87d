// Hostile clients against a drun-rendezvous daemon while a real two-node job meets there (issue 9):
// garbage, wrong magic, a header claiming a huge length, stalled halves of a hello and of a frame,
// a client that never reads its (large) replies, 1500 idle connections from one address and then
// a burst over that address' cap, clients that disconnect in the middle of a blocking get, and
// forged rendezvous state. The job must run to success beside them; the daemon must stay alive,
// bounded in memory, and give its file descriptors back once the attackers are gone.
//
// Which attack goes where: the wire-level attacks run concurrently with the real job (they must
// not disturb it). Forged rendezvous keys would legitimately break the job they target, so
// without a token they target a job of their own whose two nodes must then end cleanly (success,
// or exit 1 with a clear error: never a crash, a hang or a MASTER_ADDR that is not a host or
// address): forged before that job starts, or while it joins (between its first agent's arrival
// and its second's). With a token, forgeries against the real job's id must be refused. The slow
// reader is also repeated alone, three times on one daemon: dropped each time, nothing kept.
//
// Every attacker is a thread of this test, bounded in count and in time (kHoldAtMost).
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
#include <iostream>
#include <random>
#include <set>
#include <thread>

#include "drun/common/error.hpp"
#include "drun/common/test_skip.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/store/protocol.hpp"
#include "drun/store/tcp_store.hpp"
#include "process.hpp"

using namespace drun::test;
using namespace std::chrono_literals;
namespace wire = drun::rdzv::wire;
namespace keys = drun::rdzv::keys;

namespace {

using Clock = std::chrono::steady_clock;

// No attacker holds anything longer than this, whatever happens to the test's main thread.
constexpr auto kHoldAtMost = 45s;
constexpr int kIdleConnections = 1500;  // from 127.0.0.2: over the per-peer cap of 1024
constexpr size_t kPerPeerCap = 1024;    // StoreServerOptions::maxConnectionsPerPeer (default)
// Then, still from 127.0.0.2, this many at once: far more than the 64 refusals the server lets
// linger for their Busy reply (kMaxRefusing, store_server.cpp); the rest it closes at once.
constexpr int kBurstConnections = 512;
constexpr size_t kBigValueBytes = 1u << 20;
constexpr int kBigGets = 100;  // 100 MiB of replies: over maxOutputQueueBytes (64 MiB)
constexpr int kSlowReaderRounds = 3;  // slow readers one after another, on one daemon

// ---- the daemon ---------------------------------------------------------------------------------

long vmRssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

long openFds(pid_t pid) {
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

std::string helloBytes(const std::string& scope = "") {
  wire::Hello hello;
  hello.nonce = wire::randomNonce();
  hello.scope = scope;
  std::string out;
  wire::encodeHello(hello, out);
  return out;
}

std::string requestBytes(wire::Op op, uint64_t id, const std::string& key, uint32_t timeoutMs = 0) {
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
std::optional<wire::HelloStatus> sayHello(Raw& raw) {
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

// ---- attacks ------------------------------------------------------------------------------------

// A hello, then kBigGets gets of the 1 MiB value "hostile/big": what a slow reader sends before it
// stops reading.
std::string slowReaderRequests() {
  std::string bytes = helloBytes();
  for (int i = 0; i < kBigGets; ++i)
    bytes += requestBytes(wire::Op::Get, static_cast<uint64_t>(i + 1), "hostile/big", 5000);
  return bytes;
}

// Connections refused in one burst: every one opened (and its hello sent) before any reply is
// read, so that more than kMaxRefusing refusals are in flight at once.
struct BurstOutcome {
  int busy = 0;      // got the Busy reply
  int silent = 0;    // closed without a reply: kMaxRefusing others were being refused
  int other = 0;     // anything else (accepted, no reply and still open, not connected)
};

BurstOutcome refusedBurst(uint16_t port, const char* source, int connections) {
  std::vector<std::unique_ptr<Raw>> burst;
  for (int i = 0; i < connections; ++i) {
    burst.push_back(std::make_unique<Raw>(port, source));
    if (burst.back()->connected()) burst.back()->send(helloBytes());
  }
  BurstOutcome outcome;
  const auto deadline = Clock::now() + 10s;
  for (auto& raw : burst) {
    bool closed = false;
    const auto left = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()), 1ms);
    std::string reply = raw->connected() ? raw->receive(wire::kHelloBytes, left, &closed) : "";
    wire::HelloReply decoded;
    const bool whole = wire::decodeHelloReply(reply, decoded).status == wire::DecodeStatus::Ok;
    if (whole && decoded.status == wire::HelloStatus::Busy)
      ++outcome.busy;
    else if (reply.empty() && closed)
      ++outcome.silent;
    else
      ++outcome.other;
  }
  return outcome;
}


// What the attacks saw; filled by their threads, read once they are joined.
struct Outcomes {
  std::atomic<bool> garbageClosed{false}, wrongMagicClosed{false}, hugeLengthClosed{false};
  std::atomic<bool> slowReaderDropped{false};
  std::atomic<size_t> slowReaderBytes{0};
  std::atomic<int> idleOk{0}, idleBusy{0}, idleOther{0};
  std::atomic<int> burstBusy{0}, burstSilent{0}, burstOther{0};
  std::atomic<int> midWaitDisconnects{0};
  std::atomic<int> inPlace{0};  // attacks that are holding their connections
};

// Holds the attack's connections until the job is over (or kHoldAtMost).
void holdUntil(const std::atomic<bool>& release) {
  const auto deadline = Clock::now() + kHoldAtMost;
  while (!release && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
}

size_t countOf(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

std::string randomBytes(size_t n) {
  std::mt19937 rng(std::random_device{}());
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// The wire-level attacks, each on its own thread, started together; the job runs meanwhile.
class WireAttacks {
 public:
  WireAttacks(uint16_t port, Outcomes& outcomes, const std::atomic<bool>& release) {
    // No exception escapes a thread: an attack that throws just leaves its outcome unset.
    auto spawn = [&](auto body) {
      threads_.emplace_back([body] {
        try {
          body();
        } catch (...) {
        }
      });
    };
    spawn([port, &outcomes] {  // random bytes instead of a hello
      Raw raw(port);
      raw.send(randomBytes(4096));
      outcomes.garbageClosed = raw.closedByPeer(12s);
    });
    spawn([port, &outcomes] {  // not this protocol at all
      Raw raw(port);
      raw.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
      outcomes.wrongMagicClosed = raw.closedByPeer(12s);
    });
    spawn([port, &outcomes] {  // a frame header claiming 4 GiB
      Raw raw(port);
      std::string bytes = helloBytes();
      std::string header(wire::kHeaderBytes, '\0');
      header[0] = header[1] = header[2] = header[3] = '\xff';
      header[4] = static_cast<char>(wire::Op::Set);
      raw.send(bytes + header);
      outcomes.hugeLengthClosed = raw.closedByPeer(12s);
    });
    spawn([port, &outcomes, &release] {  // half a hello, then half a frame, held
      Raw halfHello(port);
      halfHello.send(helloBytes().substr(0, 6));
      Raw halfFrame(port);
      halfFrame.send(helloBytes() + requestBytes(wire::Op::Get, 1, "hostile/x", 1000).substr(0, 9));
      ++outcomes.inPlace;
      holdUntil(release);
    });
    spawn([port, &outcomes, &release] {  // asks for 100 MiB of replies and never reads them
      Raw raw(port, "127.0.0.1", 4096);
      raw.send(slowReaderRequests());
      ++outcomes.inPlace;
      holdUntil(release);
      size_t drained = 0;
      outcomes.slowReaderDropped = raw.closedByPeer(15s, &drained);
      outcomes.slowReaderBytes = drained;
    });
    spawn([port, &outcomes, &release] {  // 1500 idle connections from one other address, a burst
      std::vector<std::unique_ptr<Raw>> idle;
      const auto deadline = Clock::now() + 20s;
      for (int i = 0; i < kIdleConnections && Clock::now() < deadline; ++i) {
        auto raw = std::make_unique<Raw>(port, "127.0.0.2");
        auto status = raw->connected() ? sayHello(*raw) : std::nullopt;
        if (status == wire::HelloStatus::Ok) {
          ++outcomes.idleOk;
          idle.push_back(std::move(raw));
        } else if (status == wire::HelloStatus::Busy) {
          ++outcomes.idleBusy;
        } else {
          ++outcomes.idleOther;
        }
      }
      // Over the per-peer cap while the idle ones are held: refused, and refusing is bounded too.
      BurstOutcome burst = refusedBurst(port, "127.0.0.2", kBurstConnections);
      outcomes.burstBusy = burst.busy;
      outcomes.burstSilent = burst.silent;
      outcomes.burstOther = burst.other;
      ++outcomes.inPlace;
      holdUntil(release);
    });
    spawn([port, &outcomes] {  // blocking gets abandoned in the middle
      for (int i = 0; i < 20; ++i) {
        Raw raw(port);
        raw.send(helloBytes() + requestBytes(wire::Op::Get, 1, "hostile/never", 60000));
        std::this_thread::sleep_for(50ms);
        ++outcomes.midWaitDisconnects;
      }
    });
  }
  static constexpr int kHolding = 3;  // attacks that count themselves in `inPlace`

  ~WireAttacks() {
    for (std::thread& t : threads_) t.join();
  }

 private:
  std::vector<std::thread> threads_;
};

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

JobResult runJob(uint16_t port, const std::string& id, const std::string& conf, const MarkerScope& marker,
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
void parseJob(const std::string& out, std::multiset<int>& ranks, std::set<std::string>& masters) {
  for (const ConsoleLine& line : parseConsole(out)) {
    if (line.text.rfind("RANK=", 0) != 0) continue;
    ranks.insert(std::stoi(line.text.substr(5)));
    auto m = line.text.find("MASTER=");
    if (m != std::string::npos) masters.insert(line.text.substr(m + 7));
  }
}

void checkJobSucceeded(const JobResult& job) {
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
std::string checkJobEndsCleanly(const JobResult& job) {
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

drun::rdzv::TcpStoreOptions storeOptions(uint16_t port, const std::string& token = "",
                                         const std::string& scope = "") {
  drun::rdzv::TcpStoreOptions o;
  o.port = port;
  o.connectTimeout = 5s;
  o.timeout = 10s;
  o.token = token;
  o.scope = scope;
  return o;
}

void report(const std::string& attack, const std::string& outcome) {
  std::cout << "hostile: | " << attack << " | " << outcome << " |" << std::endl;
}

// Runs the wire attacks beside the real job; checks them and the daemon's resources.
void attackWhileJobRuns(Daemon& daemon, const std::string& jobId, const std::string& conf,
                        const MarkerScope& marker, const std::string& bigValueToken) {
  const long rss0 = vmRssKiB(daemon.pid());
  const long fds0 = openFds(daemon.pid());
  {
    drun::rdzv::TcpStore store(storeOptions(daemon.port, bigValueToken, ""));
    store.set("hostile/big", std::string(kBigValueBytes, 'x'));
  }

  Outcomes outcomes;
  std::atomic<bool> release{false};
  std::atomic<long> peakRss{rss0}, peakFds{fds0};
  std::thread sampler([&] {
    const auto deadline = Clock::now() + kHoldAtMost + 20s;
    while (!release && Clock::now() < deadline) {
      peakRss = std::max(peakRss.load(), vmRssKiB(daemon.pid()));
      peakFds = std::max(peakFds.load(), openFds(daemon.pid()));
      std::this_thread::sleep_for(50ms);
    }
  });
  JobResult job;
  {
    WireAttacks attacks(daemon.port, outcomes, release);
    const auto deadline = Clock::now() + 25s;
    while (outcomes.inPlace < WireAttacks::kHolding && Clock::now() < deadline)
      std::this_thread::sleep_for(20ms);
    CHECK(outcomes.inPlace.load() == WireAttacks::kHolding);
    job = runJob(daemon.port, jobId, conf, marker);
    release = true;
  }  // joins the attackers: every connection they held is closed
  sampler.join();

  checkJobSucceeded(job);
  CHECK(daemon.alive());
  const bool garbageClosed = outcomes.garbageClosed, wrongMagicClosed = outcomes.wrongMagicClosed,
             hugeLengthClosed = outcomes.hugeLengthClosed, slowReaderDropped = outcomes.slowReaderDropped;
  const int idleOk = outcomes.idleOk, idleBusy = outcomes.idleBusy, idleOther = outcomes.idleOther;
  const int burstBusy = outcomes.burstBusy, burstSilent = outcomes.burstSilent,
            burstOther = outcomes.burstOther;
  const size_t slowReaderBytes = outcomes.slowReaderBytes;
  const long peakRssKiB = peakRss, peakFdCount = peakFds;
  CHECK(garbageClosed);
  CHECK(wrongMagicClosed);
  CHECK(hugeLengthClosed);
  CHECK(idleOk + idleBusy + idleOther == kIdleConnections);
  if (bigValueToken.empty()) {
    CHECK(static_cast<size_t>(idleOk) <= kPerPeerCap);
    CHECK(idleBusy >= kIdleConnections - static_cast<int>(kPerPeerCap));
    // The burst came with 127.0.0.2 at its cap, before the job started: every connection of it
    // was refused with Busy, or closed without a reply when 256 (maxPendingConnections) newer
    // ones arrived before its hello was taken; the job above then ran to success on the server.
    CHECK(burstBusy + burstSilent == kBurstConnections);
    CHECK(burstBusy >= 1);
  } else {
    // With a token a hello is answered with the challenge, and the connection stays pending
    // (no proof follows): it takes no seat, so no cap refuses it; at most 256 such are held
    // (the oldest dropped for a newer one), each for at most the 3 s handshake deadline.
    CHECK(idleBusy == 0);
    CHECK(burstBusy == 0);
    CHECK(peakFdCount < fds0 + 256 + 64);
  }
  CHECK(outcomes.midWaitDisconnects.load() == 20);
  // Without a token the slow reader is served until its queue passes 64 MiB, then dropped; with
  // one it never got past the handshake (its requests were not a proof): closed either way.
  CHECK(slowReaderDropped);
  CHECK(slowReaderBytes < size_t(kBigGets) * kBigValueBytes);

  // The daemon gives back what the attackers took.
  long fdsAfter = -1;
  const auto deadline = Clock::now() + 15s;
  do {
    std::this_thread::sleep_for(100ms);
    fdsAfter = openFds(daemon.pid());
  } while (fdsAfter > fds0 + 4 && Clock::now() < deadline);
  const long rssAfter = vmRssKiB(daemon.pid());
  CHECK(fdsAfter <= fds0 + 4);
  if (!kSanitizedBuild) {
    CHECK(rssAfter < rss0 + 96 * 1024);  // the output queue's cap (64 MiB) plus slack
    CHECK(peakRssKiB < rss0 + 192 * 1024);
  }

  report("random garbage (4 KiB)", garbageClosed ? "closed" : "NOT closed");
  report("wrong magic (HTTP)", wrongMagicClosed ? "closed" : "NOT closed");
  report("header claiming 4 GiB", hugeLengthClosed ? "closed" : "NOT closed");
  report("half hello + half frame", "held while the job ran (a half hello only until the 3 s handshake deadline)");
  report("never reads 100 x 1 MiB gets", std::string(slowReaderDropped ? "dropped" : "NOT dropped") +
                                              " after " + std::to_string(slowReaderBytes / 1024) + " KiB read");
  report("1500 idle from 127.0.0.2", std::to_string(idleOk) + " ok, " + std::to_string(idleBusy) +
                                         " busy, " + std::to_string(idleOther) + " other");
  report(std::to_string(kBurstConnections) + " at once from 127.0.0.2 (at its cap)",
         std::to_string(burstBusy) + " busy, " + std::to_string(burstSilent) +
             " closed without a reply, " + std::to_string(burstOther) + " other");
  report("20 disconnects mid blocking get", "daemon alive");
  report("real 2-node job beside them",
         "exit " + std::to_string(job.a.status()) + " / " + std::to_string(job.b.status()));
  report("daemon RSS KiB start/peak/after",
         std::to_string(rss0) + " / " + std::to_string(peakRssKiB) + " / " + std::to_string(rssAfter));
  report("daemon fds start/peak/after",
         std::to_string(fds0) + " / " + std::to_string(peakFdCount) + " / " + std::to_string(fdsAfter));
}

}  // namespace

TEST_CASE("hostile clients: an open store serves a real job beside wire attacks and forged rounds",
          "[e2e][hostile]") {
  MarkerScope marker;
  Daemon daemon({});
  attackWhileJobRuns(daemon, "real-" + randomHex(6), "is_host=0,join_timeout=20", marker, "");

  // Forged rendezvous state, written before a second job (its own run id) joins.
  struct Forgery {
    std::string name;
    std::function<void(drun::rdzv::TcpStore&, const std::string&)> write;
  };
  const std::string evilHeader = "ok\t2\t4\tevil;rm -rf /\t29500\t0\t0\t0\n";
  const std::vector<Forgery> forgeries = {
      {"round = garbage",
       [](drun::rdzv::TcpStore& s, const std::string& id) { s.set(keys::currentRound(id), "\x01\x02 nope"); }},
      {"round 0 state: MASTER_ADDR 'evil;rm -rf /'",
       [&](drun::rdzv::TcpStore& s, const std::string& id) {
         s.set(keys::currentRound(id), "0");
         s.set(keys::state(id, 0), evilHeader + "aaaa\tevil;rm\t2\nbbbb\tevil;rm\t2\n");
         s.set(keys::status(id, 0), evilHeader);
       }},
      {"round 0 state: 1 MiB error with control chars",
       [](drun::rdzv::TcpStore& s, const std::string& id) {
         std::string error = "error\t\x1b[2J\x1b[31m" + std::string(1 << 20, 'A') + "\r\x07\n";
         s.set(keys::currentRound(id), "0");
         s.set(keys::state(id, 0), error);
         s.set(keys::status(id, 0), error);
       }},
  };
  for (const Forgery& forgery : forgeries) {
    INFO(forgery.name);
    const std::string id = "victim-" + randomHex(6);
    {
      drun::rdzv::TcpStore attacker(storeOptions(daemon.port));
      forgery.write(attacker, id);
    }
    JobResult job = runJob(daemon.port, id, "is_host=0,join_timeout=5", marker);
    report("forged: " + forgery.name, checkJobEndsCleanly(job));
  }

  // The daemon still serves.
  drun::rdzv::TcpStore check(storeOptions(daemon.port));
  check.set("hostile/final", "ok");
  CHECK(check.get("hostile/final", 5s) == "ok");
  CHECK(marker.leftovers(5s).empty());
  daemon.process->signal(SIGTERM);
  CHECK(daemon.process->wait(10s).status() == 0);
}

TEST_CASE("hostile clients: state forged while an open store's job joins ends the job cleanly",
          "[e2e][hostile]") {
  MarkerScope marker;
  Daemon daemon({});
  const long fds0 = openFds(daemon.pid());

  // A node nobody runs: a well-formed descriptor with no agent (and so no will) behind it.
  keys::NodeDescriptor phantom;
  phantom.id = "phantom-" + randomHex(8);
  phantom.host = "phantom";
  phantom.addr = "127.0.0.77";
  phantom.localWorldSize = 2;
  phantom.masterPort = 29999;
  // A round-0 decision naming the job's first agent and the phantom.
  auto decisionWith = [&](const keys::NodeDescriptor& first, const std::string& masterAddr) {
    keys::RoundState state;
    state.nodeCount = 2;
    state.worldSize = 4;
    state.masterAddr = masterAddr;
    state.masterPort = 29500;
    state.roster = {{first.id, first.displayName(), 2}, {phantom.id, phantom.displayName(), 2}};
    return state;
  };
  auto forgeDecision = [](drun::rdzv::TcpStore& s, const std::string& id, const keys::RoundState& state) {
    s.compareSet(keys::state(id, 0), "", keys::encodeState(state));
    s.set(keys::status(id, 0), keys::encodeState(state, false));  // wakes the waiting agent
  };

  // Each forgery is written once the job's first agent has arrived in round 0 (`first`: its
  // descriptor, as the store holds it), before the second agent starts.
  enum class Expect {
    Success,   // the rendezvous tolerates it: the job still forms and succeeds
    CleanEnd,  // success, or exit 1 with a clear error
    // A made-up member: on an open store it cannot be told from a real node whose workers are
    // still busy (anyone who reaches the port can be a node; the defence is a token), so the
    // job waits for it as for a slow node: the first agent in its exit barrier, the second a
    // spare. The wait must be a clean one, and SIGTERM must end it at once.
    WaitsForPhantom,
  };
  struct JoinForgery {
    std::string name;
    Expect expect;
    std::function<void(drun::rdzv::TcpStore&, const std::string&, const keys::NodeDescriptor&)> write;
  };
  using Store = drun::rdzv::TcpStore;
  using Node = keys::NodeDescriptor;
  const std::vector<JoinForgery> forgeries = {
      {"round = 7", Expect::CleanEnd,
       [](Store& s, const std::string& id, const Node&) { s.set(keys::currentRound(id), "7"); }},
      {"round = garbage", Expect::CleanEnd,
       [](Store& s, const std::string& id, const Node&) { s.set(keys::currentRound(id), "\x01\x02 nope"); }},
      {"garbage lines in joined + count bumped", Expect::Success,
       [](Store& s, const std::string& id, const Node&) {
         s.append(keys::joined(id, 0), "\x1b[2J\tevil;rm -rf /\t\t\nx\ty\tevil;rm\t2\t-\t29500\t-\n" +
                                           std::string(8192, 'A') + "\n");
         s.add(keys::count(id, 0), 3);
       }},
      {"a torn line in joined (no newline)", Expect::CleanEnd,
       [](Store& s, const std::string& id, const Node&) { s.append(keys::joined(id, 0), "torn\tline"); }},
      {"changes + 1000 / status + 1 / 1 MiB last_change", Expect::Success,
       [](Store& s, const std::string& id, const Node&) {
         s.add(keys::changes(id, 0), 1000);
         s.set(keys::lastChange(id, 0), "\x1b[2J" + std::string(1 << 20, 'B') + "\r\x07");
         s.add(keys::status(id, 0), 1);
       }},
      {"count = garbage", Expect::CleanEnd,
       [](Store& s, const std::string& id, const Node&) { s.set(keys::count(id, 0), "\x1b[2J many"); }},
      {"status = garbage", Expect::CleanEnd,
       [](Store& s, const std::string& id, const Node&) { s.set(keys::status(id, 0), "\x1b[2J\tok\t"); }},
      {"changes = -1 / left = -1", Expect::CleanEnd,
       [](Store& s, const std::string& id, const Node&) {
         s.add(keys::changes(id, 0), -1);
         s.add(keys::left(id, 0), -1);
       }},
      {"outcome = succeeded", Expect::Success,  // before any round closed: not believed
       [](Store& s, const std::string& id, const Node&) {
         s.set(keys::outcome(id), keys::encodeOutcome(std::nullopt));
         s.add(keys::status(id, 0), 1);
       }},
      {"dead flag of the first node", Expect::CleanEnd,
       [](Store& s, const std::string& id, const Node& first) {
         s.set(keys::dead(id, 0, first.id), "1");
         s.add(keys::changes(id, 0), 1);
         s.add(keys::status(id, 0), 1);
       }},
      {"assignment and host list ahead of the close", Expect::Success,
       [](Store& s, const std::string& id, const Node& first) {
         s.set(keys::assign(id, 0, first.id), "7\t\x1b[2J");
         s.set(keys::hosts(id, 0), "=evil;rm -rf /\n=\x1b[2J\n");
       }},
      {"config = --nnodes 3", Expect::CleanEnd,
       [](Store& s, const std::string& id, const Node&) {
         s.set(keys::config(id), keys::encodeJobConfig({3, 3, "evil"}));
       }},
      {"decision with MASTER_ADDR 'evil;rm -rf /'", Expect::CleanEnd,
       [&](Store& s, const std::string& id, const Node& first) {
         forgeDecision(s, id, decisionWith(first, "evil;rm -rf /"));
       }},
      {"a phantom node in joined", Expect::WaitsForPhantom,
       [&](Store& s, const std::string& id, const Node&) {
         s.append(keys::joined(id, 0), keys::encodeDescriptor(phantom));
         s.add(keys::count(id, 0), 1);
       }},
      {"decision naming the first node and a phantom", Expect::WaitsForPhantom,
       [&](Store& s, const std::string& id, const Node& first) {
         forgeDecision(s, id, decisionWith(first, phantom.addr));
       }},
  };
  for (const JoinForgery& forgery : forgeries) {
    INFO(forgery.name);
    const std::string id = "joining-" + randomHex(6);
    JobHooks hooks;
    hooks.betweenAgents = [&] {
      Store forger(storeOptions(daemon.port));
      forger.get(keys::count(id, 0), 15s);  // the first agent arrived (it appends to joined first)
      auto joined = keys::parseJoined(forger.get(keys::joined(id, 0), 5s));
      REQUIRE(joined.size() == 1);
      forgery.write(forger, id, joined.front());
    };
    bool waited = false;
    if (forgery.expect == Expect::WaitsForPhantom) {
      hooks.whileRunning = [&](Process& first, Process& second) {
        auto says = [](Process& p, const std::string& text) {
          return p.waitForOutput(
              [&](const std::string&, const std::string& err) { return err.find(text) != std::string::npos; },
              20s);
        };
        const bool inBarrier = says(first, "waiting for the other 1 node(s) of the job");
        const bool spare = says(second, "waits as a spare");
        waited = inBarrier && spare;
        first.signal(SIGTERM);
        second.signal(SIGTERM);
      };
    }
    JobResult job = runJob(daemon.port, id, "is_host=0,join_timeout=5", marker, hooks);
    std::string outcome;
    if (forgery.expect == Expect::WaitsForPhantom) {
      INFO(job.describe());
      CHECK(waited);
      std::multiset<int> ranks;
      std::set<std::string> masters;
      parseJob(job.a.out, ranks, masters);
      CHECK(ranks.size() == 2);  // the first agent's workers ran (and ended), beside the phantom's
      CHECK(masters.size() == 1);
      for (const std::string& m : masters) CHECK(keys::isHostOrAddress(m));
      for (const RunResult* r : {&job.a, &job.b}) {
        CHECK(!r->timedOut);
        CHECK(r->status() == 128 + SIGTERM);
      }
      outcome = std::string(waited ? "waited (exit barrier / spare)" : "did NOT wait as expected") +
                ", then SIGTERM: exit " + std::to_string(job.a.status()) + " / " +
                std::to_string(job.b.status());
    } else {
      outcome = checkJobEndsCleanly(job);
      if (forgery.expect == Expect::Success) checkJobSucceeded(job);
    }
    report("forged while joining: " + forgery.name, outcome);
  }

  CHECK(daemon.alive());
  drun::rdzv::TcpStore check(storeOptions(daemon.port));
  check.set("hostile/final", "ok");
  CHECK(check.get("hostile/final", 5s) == "ok");
  CHECK(openFds(daemon.pid()) <= fds0 + 4);
  CHECK(marker.leftovers(5s).empty());
  daemon.process->signal(SIGTERM);
  CHECK(daemon.process->wait(10s).status() == 0);
}

TEST_CASE("hostile clients: a slow reader is dropped at each of three attacks and the daemon gives back its memory and fds",
          "[e2e][hostile]") {
  // Debug logging: the daemon says why it closed each connection (on stderr).
  Daemon daemon({"--log-level", "debug"});
  const pid_t pid = daemon.pid();
  {
    drun::rdzv::TcpStore store(storeOptions(daemon.port));
    store.set("hostile/big", std::string(kBigValueBytes, 'x'));
  }
  const long rss0 = vmRssKiB(pid), fds0 = openFds(pid);
  for (int round = 1; round <= kSlowReaderRounds; ++round) {
    INFO("slow reader " << round);
    const long rssBefore = vmRssKiB(pid), fdsBefore = openFds(pid);
    long peakRss = rssBefore;
    Raw raw(daemon.port, "127.0.0.1", 4096);
    REQUIRE(raw.connected());
    REQUIRE(raw.send(slowReaderRequests()));
    // Dropped for its output queue (64 MiB of the 100 MiB asked for), while it still reads nothing.
    bool dropped = false;
    const auto deadline = Clock::now() + 20s;
    while (!dropped && Clock::now() < deadline) {
      peakRss = std::max(peakRss, vmRssKiB(pid));
      dropped = daemon.process->waitForOutput(
          [&](const std::string&, const std::string& log) {
            return countOf(log, "closed (output queue over") >= static_cast<size_t>(round);
          },
          50ms);
    }
    CHECK(dropped);
    long fdsAfter = openFds(pid);
    for (const auto fdDeadline = Clock::now() + 10s; fdsAfter > fdsBefore && Clock::now() < fdDeadline;
         fdsAfter = openFds(pid))
      std::this_thread::sleep_for(20ms);
    const long rssAfter = vmRssKiB(pid);
    size_t drained = 0;
    const bool closed = raw.closedByPeer(15s, &drained);
    CHECK(closed);
    CHECK(drained < size_t(kBigGets) * kBigValueBytes);
    CHECK(fdsAfter <= fdsBefore);
    if (!kSanitizedBuild) {
      CHECK(peakRss < rss0 + 192 * 1024);
      CHECK(rssAfter < rss0 + 96 * 1024);  // the queue's cap plus slack, whatever the round
    }
    report("slow reader " + std::to_string(round) + " of " + std::to_string(kSlowReaderRounds),
           std::string(dropped ? "dropped (output queue over 64 MiB)" : "NOT dropped") + " after " +
               std::to_string(drained / 1024) + " KiB read; RSS KiB before/peak/after " +
               std::to_string(rssBefore) + " / " + std::to_string(peakRss) + " / " +
               std::to_string(rssAfter) + "; fds before/after " + std::to_string(fdsBefore) + " / " +
               std::to_string(fdsAfter));
  }
  CHECK(openFds(pid) <= fds0);
  drun::rdzv::TcpStore check(storeOptions(daemon.port));
  CHECK(check.get("hostile/big", 5s).size() == kBigValueBytes);  // still serving, big replies too
  daemon.process->signal(SIGTERM);
  CHECK(daemon.process->wait(10s).status() == 0);
}

TEST_CASE("hostile clients: a store with a token refuses forgers while its job runs", "[e2e][hostile]") {
  MarkerScope marker;
  TempDir dir;
  const std::string token = randomHex(48);
  auto tokenFile = dir.write("token", token + "\n");
  Daemon daemon({"--token-file", tokenFile.string()});
  const std::string id = "real-" + randomHex(6);

  // Forgers against the job's own id, before it starts: no token, then a wrong one.
  for (const std::string& wrong : {std::string(), randomHex(48)}) {
    INFO("attacker token: '" << wrong << "'");
    bool refused = false;
    try {
      drun::rdzv::TcpStore forger(storeOptions(daemon.port, wrong, id));
      forger.set(keys::currentRound(id), "999");
    } catch (const drun::AuthError& e) {
      refused = true;
      CHECK_THAT(std::string(e.what()), Catch::Contains("token"));
    }
    CHECK(refused);
    report(std::string("forge round of the job's id, ") + (wrong.empty() ? "no token" : "wrong token"),
           refused ? "refused (AuthError)" : "NOT refused");
  }
  // A raw client that answers the challenge with a made-up proof.
  {
    Raw raw(daemon.port);
    CHECK(sayHello(raw) == wire::HelloStatus::Ok);
    std::string mac;
    wire::encodeAuth(wire::Mac{}, mac);
    raw.send(mac);
    bool closed = raw.closedByPeer(5s);
    CHECK(closed);
    report("made-up auth proof", closed ? "refused and closed" : "NOT closed");
  }

  attackWhileJobRuns(daemon, id, "is_host=0,join_timeout=20,token_file=" + tokenFile.string(), marker,
                     token);

  drun::rdzv::TcpStore check(storeOptions(daemon.port, token));
  check.set("hostile/final", "ok");
  CHECK(check.get("hostile/final", 5s) == "ok");
  CHECK(marker.leftovers(5s).empty());
  daemon.process->signal(SIGTERM);
  CHECK(daemon.process->wait(10s).status() == 0);
}

// Issue 15: 1,400 connections that never say hello, 50 that send garbage and 50 stalled in the
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

// Hostile clients against a drun-rendezvous daemon while a real two-node job meets there:
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
//
// The other hostile_*_test.cpp files: forged rendezvous state while a job joins
// (hostile_forgery_test.cpp), slow readers alone (hostile_slow_reader_test.cpp), and a crowd from
// the job's own address (hostile_crowd_test.cpp); their shared helpers: support/hostile_clients.hpp.
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
#include "hostile_clients.hpp"
#include "process.hpp"

using namespace drun::test;
using namespace drun::test::hostile;
using namespace std::chrono_literals;

namespace {

// No attacker holds anything longer than this, whatever happens to the test's main thread.
constexpr auto kHoldAtMost = 45s;
constexpr int kIdleConnections = 1500;  // from 127.0.0.2: over the per-peer cap of 1024
constexpr size_t kPerPeerCap = 1024;    // StoreServerOptions::maxConnectionsPerPeer (default)
// Then, still from 127.0.0.2, this many at once: far more than the 64 refusals the server lets
// linger for their Busy reply (kMaxRefusing, store_server.cpp); the rest it closes at once.
constexpr int kBurstConnections = 512;

// ---- attacks ------------------------------------------------------------------------------------

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
  const std::string evilHeader = "ok\t2\t4\tevil;rm -rf /\t29500\t0\t0\t0\t0000000000000000\n";
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

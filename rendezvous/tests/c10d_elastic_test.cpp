// The elastic core's defects, one test each: a job re-forms as ONE job whatever
// arrives while it runs, a known node is never left without the store, a job that ended leaves
// nothing behind its id, and lost nodes can be replaced. Agents are threads over one MemoryStore
// (or loopback TcpStores when a test needs the embedded server); sequenced through the store and
// futures, never sleeps (but for a fault's own duration).
#include <catch2/catch.hpp>
#include <thread>

#include "c10d_test_support.hpp"
#include "drun/rendezvous/port_reservation.hpp"
#include "tcp_relay.hpp"

using namespace drun;
using namespace drun::rdzv;
using namespace drun::rdzv::test;
using namespace std::chrono_literals;

namespace {

// A round must not form beside a running one: proof that `f` is still waiting.
void stillWaiting(std::future<RoundResult>& f, std::chrono::milliseconds for_) {
  CHECK(f.wait_for(for_) == std::future_status::timeout);
}

}  // namespace

TEST_CASE("elastic: a newcomer to a running 1:2 job waits for it to re-form, it never runs beside "
          "it", "[rendezvous]") {
  MemoryCluster cluster;
  auto o = options(1, 2);
  o.lastCallTimeout = 100ms;
  auto a = cluster.agent(withNode(o, "hostA"));
  FirstChange told(*a, "waiting");
  auto fa = startNext(*a);
  const RoundResult first = getWithin(fa);
  CHECK(first.nodeCount == 1);
  auto b = cluster.agent(withNode(o, "hostB"));
  auto fb = startNext(*b);
  CHECK_THAT(told.get(), Catch::Contains("hostB is waiting to join"));
  // hostB alone is MIN: its own last call must not form a second job (rank 0 of 1).
  stillWaiting(fb, 10 * o.lastCallTimeout);
  fa = startNext(*a);  // hostA's workers stopped: it re-forms, taking hostB in
  std::vector<RoundResult> second = {getWithin(fa), getWithin(fb)};
  checkRound(second, {1, 1});
  CHECK(second[0].round == first.round + 1);
}

TEST_CASE("elastic: MIN newcomers arriving at a running 2:4 job join it, they form no job of their "
          "own", "[rendezvous]") {
  MemoryCluster cluster;
  auto o = options(2, 4);
  o.lastCallTimeout = 100ms;
  auto job = formedJob(cluster, o, {"hostA", "hostB"});
  auto& a = job[0];
  auto& b = job[1];
  auto c = cluster.agent(withNode(o, "hostC"));
  auto d = cluster.agent(withNode(o, "hostD"));
  auto fc = startNext(*c);
  auto fd = startNext(*d);
  stillWaiting(fc, 10 * o.lastCallTimeout);
  stillWaiting(fd, 0ms);
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  std::vector<RoundResult> all = {getWithin(fa), getWithin(fb), getWithin(fc), getWithin(fd)};
  checkRound(all, {1, 1, 1, 1});
  CHECK(all[0].round == 1);
}

TEST_CASE("elastic: the same --nnodes 1 command started twice with one id: the second waits as a "
          "spare and ends with the job", "[rendezvous]") {
  MemoryCluster cluster;
  auto a = cluster.agent(withNode(options(1, 1), "hostA"));
  auto fa = startNext(*a);
  getWithin(fa);
  auto b = cluster.agent(withNode(options(1, 1), "hostA"));
  auto fb = startNext(*b);
  awaitArrivals(cluster.store(), "job", 1, 1);
  stillWaiting(fb, 500ms);  // not a second job (rank 0 of 1) beside hostA
  CHECK(a->finish());
  REQUIRE(fb.wait_for(kHang) == std::future_status::ready);
  try {
    fb.get();
    FAIL("the spare formed a round of its own");
  } catch (const JobEnded& e) {
    CHECK(e.exitCode() == 0);
  }
  a->leave();
  b->leave();
  CHECK(keysBesidesTombstone(cluster.store(), "job") == 0);  // the last known node out removes the job's keys
}

TEST_CASE("elastic: a lost member of a 2:2 job is replaced by a newcomer, at no restart",
          "[rendezvous]") {
  MemoryCluster cluster;
  auto o = options(2, 2);
  o.replaceTimeout = 10s;
  std::vector<std::string> said;
  std::mutex saidMutex;
  auto oa = withNode(o, "hostA");
  oa.say = [&](const std::string& line) {
    std::lock_guard lock(saidMutex);
    said.push_back(line);
  };
  auto a = cluster.agent(oa);
  auto b = cluster.agent(withNode(o, "hostB"));
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  checkRound({getWithin(fa), getWithin(fb)}, {1, 1});
  loseMember(*a, b);  // SIGKILL: its will runs
  fa = startNext(*a);
  stillWaiting(fa, 300ms);  // it waits for a replacement, it does not fail
  {
    std::lock_guard lock(saidMutex);
    REQUIRE_FALSE(said.empty());
    CHECK_THAT(said.back(), Catch::Contains("lost node(s) hostB") &&
                                Catch::Contains("waiting up to 10s for replacement"));
  }
  auto c = cluster.agent(withNode(o, "hostC"));
  auto fc = startNext(*c);
  std::vector<RoundResult> second = {getWithin(fa), getWithin(fc)};
  checkRound(second, {1, 1});
  CHECK(second[0].restartCount == 0);  // a membership change spends no restart
  CHECK(second[0].round == 1);
}

TEST_CASE("elastic: no replacement within replace_timeout: every survivor fails naming the lost "
          "node", "[rendezvous]") {
  MemoryCluster cluster;
  auto o = options(3, 3);
  o.replaceTimeout = 300ms;
  auto job = formedJob(cluster, o, {"hostA", "hostB", "hostC"});
  loseMember(*job[0], job[2]);
  auto fa = startNext(*job[0]);
  auto fb = startNext(*job[1]);
  for (auto* f : {&fa, &fb}) {
    REQUIRE(f->wait_for(kHang) == std::future_status::ready);
    CHECK_THROWS_WITH(f->get(), Catch::Contains("lost node(s) hostC") &&
                                    Catch::Contains("no replacement came within 0.3s"));
  }
}

TEST_CASE("elastic: a job that failed after losing a node leaves nothing its id can trip on",
          "[rendezvous]") {
  MemoryCluster cluster;
  {
    auto [a, b] = runningPair(cluster);
    b.reset();
    auto fa = startNext(*a);
    CHECK_THROWS_WITH(getWithin(fa), Catch::Contains("fewer than the minimum"));
    a->leave();
  }
  CHECK(keysBesidesTombstone(cluster.store(), "job") == 0);
  // The same two commands again, at once: a normal first round.
  auto [a, b] = runningPair(cluster);
  CHECK(a->finish());
  CHECK(b->finish());
}

TEST_CASE("elastic: an ended job whose last node died without leaving is reset by the next start "
          "with its id", "[rendezvous]") {
  MemoryCluster cluster;
  {
    auto [a, b] = runningPair(cluster);
    CHECK(a->finish());
    CHECK(b->finish());  // the outcome is written
    a->leave();
    b.reset();    // SIGKILLed in the exit barrier: its will runs, nobody removes the keys
  }
  REQUIRE(cluster.store().tryGet(keys::outcome("job")));
  auto [a, b] = runningPair(cluster);
  CHECK_FALSE(cluster.store().tryGet(keys::outcome("job")));  // the old outcome is gone
}

TEST_CASE("elastic: the store's host serves until a spare has left, even a slow one",
          "[rendezvous]") {
  auto reserved = PortReservation::reserve("127.0.0.1");
  auto o = options(2, 2, "barrier");
  o.endpoint.host = "127.0.0.1";
  o.endpoint.port = reserved.port();
  o.closeTimeout = 20s;
  reserved.release();
  auto host = makeC10dRendezvous(withNode(o, ""));
  auto member = makeC10dRendezvous(withNode(o, ""));
  auto fh = startNext(*host);
  auto fm = startNext(*member);
  checkRound({getWithin(fh), getWithin(fm)}, {1, 1});
  auto spare = makeC10dRendezvous(withNode(o, ""));
  auto fs = startNext(*spare);
  {
    // The spare waits in round 1 before the job ends (one arriving after the end waits for the
    // leaving nodes, then starts afresh: another case).
    TcpStoreOptions observer;
    observer.endpoint.port = o.endpoint.port;
    observer.connectTimeout = 5s;
    TcpStore store(observer);
    awaitArrivals(store, "barrier", 1, 1);
  }
  FirstChange done(*host, "succeeded");
  CHECK(member->finish());
  CHECK(host->finish());
  done.get();
  // The spare learns the job's end; until it has left, the host keeps the store up.
  REQUIRE(fs.wait_for(kHang) == std::future_status::ready);
  CHECK_THROWS_AS(fs.get(), JobEnded);
  member->leave();
  auto hostLeft = std::async(std::launch::async, [&] { host->leave(); });
  CHECK(hostLeft.wait_for(500ms) == std::future_status::timeout);  // the slow spare is still here
  spare->leave();
  CHECK(hostLeft.wait_for(kHang) == std::future_status::ready);
}

namespace {

// A 2:2 job whose host (hostA) embeds the store on loopback, its member (hostB), and a spare
// (hostC) waiting in round 1 whose connection goes through a relay the test cuts or drops; the
// spare connects again only once the test calls comeBack(). Then the job ends and both leave
// (the host on a thread of its own: it serves the store until `hostLeft`). With `hostLinked`
// the host's own connection to its store goes through a relay too (`hostLink`).
struct JobEndingBesideLinkedSpare {
  RendezvousOptions o;
  StoreServer* hosted = nullptr;  // owned by `host`
  TcpStoreOptions client;
  std::unique_ptr<TcpRelay> link, hostLink;
  std::promise<void> back;
  std::unique_ptr<Rendezvous> host, member, spare;
  std::future<RoundResult> fs;
  std::unique_ptr<TcpStore> observer;
  std::future<void> hostLeft;

  explicit JobEndingBesideLinkedSpare(const std::string& runId, bool hostLinked = false)
      : o(options(2, 2, runId)) {
    o.closeTimeout = 20s;
    auto server = std::make_unique<StoreServer>([] {
      StoreServerOptions s;
      s.listen = {"127.0.0.1", 0};
      return s;
    }());
    server->start();
    hosted = server.get();
    client.endpoint.port = hosted->port();
    client.connectTimeout = 5s;
    client.timeout = 10s;
    client.heartbeatInterval = o.heartbeatInterval;
    client.leaseTimeout = o.heartbeatTimeout;
    C10dStoreAccess hostAccess = access(std::move(server));
    if (hostLinked) {
      hostLink = std::make_unique<TcpRelay>(client.endpoint.port);
      TcpStoreOptions linked = client;
      linked.endpoint.port = hostLink->port();
      hostAccess.store = std::make_unique<TcpStore>(linked);
    }
    host = makeC10dRendezvous(withNode(o, "hostA"), std::move(hostAccess));
    member = makeC10dRendezvous(withNode(o, "hostB"), access());
    auto fh = startNext(*host);
    auto fm = startNext(*member);
    checkRound({getWithin(fh), getWithin(fm)}, {1, 1});
    link = std::make_unique<TcpRelay>(client.endpoint.port);
    C10dStoreAccess spareAccess = access();
    TcpStoreOptions linked = client;
    linked.endpoint.port = link->port();
    spareAccess.store = std::make_unique<TcpStore>(linked);
    std::shared_future<void> isBack = back.get_future().share();
    spareAccess.connectWatcher = [c = client, isBack] {
      isBack.wait();
      return std::make_unique<TcpStore>(c);
    };
    spare = makeC10dRendezvous(withNode(o, "hostC"), std::move(spareAccess));
    fs = startNext(*spare);
    observer = std::make_unique<TcpStore>(client);
    awaitArrivals(*observer, runId, 1, 1);
  }

  // A test that stopped early lets the spare connect again, so that its join can end.
  ~JobEndingBesideLinkedSpare() {
    try {
      back.set_value();
    } catch (const std::future_error&) {  // it came back already
    }
  }
  JobEndingBesideLinkedSpare(const JobEndingBesideLinkedSpare&) = delete;
  JobEndingBesideLinkedSpare& operator=(const JobEndingBesideLinkedSpare&) = delete;

  C10dStoreAccess access(std::unique_ptr<StoreServer> embedded = nullptr) const {
    C10dStoreAccess a;
    a.store = std::make_unique<TcpStore>(client);
    a.connectWatcher = [c = client] { return std::make_unique<TcpStore>(c); };
    a.endpoint = client.endpoint.toString();
    a.server = std::move(embedded);
    return a;
  }

  void endJob(const std::function<void()>& beforeHostLeaves = {}) {
    FirstChange done(*host, "succeeded");
    CHECK(member->finish());
    CHECK(host->finish());
    done.get();
    member->leave();
    if (beforeHostLeaves) beforeHostLeaves();
    hostLeft = std::async(std::launch::async, [this] { host->leave(); });
  }

  // Until the spare's will has counted it out of `present` (the host's wait for it ends).
  void awaitSpareCountedOut() {
    const std::string present = keys::present(o.runId);
    const Deadline expiry(kHang);
    for (auto value = observer->tryGet(present); keys::parseCounter(value).value_or(0) > 0;) {
      REQUIRE_FALSE(expiry.expired());
      value = observer->watch(present, value, expiry.remaining());
    }
  }

  // The spare back: it must learn that the job succeeded, not join a round nor lose the store.
  void comeBackAndLearnTheEnd() {
    back.set_value();
    REQUIRE(fs.wait_for(kHang) == std::future_status::ready);
    try {
      fs.get();
      FAIL("the spare joined a round of a job that ended");
    } catch (const JobEnded& e) {
      CHECK(e.exitCode() == 0);
      CHECK_THAT(e.what(), Catch::Contains("the job finished (every worker succeeded)"));
    } catch (const std::exception& e) {
      FAIL("the spare did not learn the job's end: " << e.what());
    }
    CHECK(hostLeft.wait_for(kHang) == std::future_status::ready);
    spare->leave();
  }
};

}  // namespace

// A spare cut off past its lease as the job ends (over a real link, TCP's retransmissions back
// off past a shorter cut; a paused process too): its will counts it out, the host's last wait
// ends, and the spare comes back after it. It must find the store still up and learn how the
// job ended, not exit 1 "lost the store" after a job that succeeded.
TEST_CASE("elastic: the store's host serves a spare that went silent past its lease long enough "
          "to learn the job's end", "[rendezvous]") {
  JobEndingBesideLinkedSpare job("silent");
  job.link->cut();
  job.endJob();
  // The spare's lease ends: the fault itself, not a synchronisation; it stays away a while after.
  job.awaitSpareCountedOut();
  CHECK(job.hosted->stats().leasesExpired >= 1);
  std::this_thread::sleep_for(300ms);
  job.link->restore();
  job.comeBackAndLearnTheEnd();
}

// A spare that gave up on its connection as the job ends (no reply within its read limit: the
// store's process was stopped a while) closes it itself: its will counts it out with no lease
// expired, the host's last wait ends, and the spare connects again a moment later. The same end
// is owed to it.
TEST_CASE("elastic: the store's host serves a spare that dropped its connection long enough to "
          "learn the job's end", "[rendezvous]") {
  JobEndingBesideLinkedSpare job("dropped");
  job.endJob();
  job.link->drop();
  job.awaitSpareCountedOut();
  CHECK(job.hosted->stats().leasesExpired == 0);  // closed, not silent
  std::this_thread::sleep_for(300ms);
  job.comeBackAndLearnTheEnd();
}

// The store's host stopped a while as the job ends: its own connection to its store broke
// (its lease expired), and a spare that gave up on the silent store is away. The host still owes
// the spare what a clean leave gives: the store up until it is back, not stopped at once.
TEST_CASE("elastic: a store's host whose own connection broke as the job ended still serves a "
          "spare coming back", "[rendezvous]") {
  JobEndingBesideLinkedSpare job("hostdrop", true);
  job.endJob([&] {
    job.link->drop();
    job.hostLink->drop();
  });
  job.awaitSpareCountedOut();
  std::this_thread::sleep_for(300ms);
  job.comeBackAndLearnTheEnd();
}

// A finished member and a scale-up are the two ends of a round: the first in the store wins
// (keys::ending). Before, each waited for the other until the join timeout.
namespace {

// hostA and hostB run a 2:3 job; hostC arrived and waits to join it.
struct PairAndNewcomer {
  MemoryCluster cluster;
  std::vector<std::unique_ptr<Rendezvous>> job;
  std::unique_ptr<Rendezvous> newcomer;
  std::future<RoundResult> newcomerJoin;

  PairAndNewcomer() {
    auto o = options(2, 3);
    o.lastCallTimeout = 100ms;
    job = formedJob(cluster, o, {"hostA", "hostB"});
    newcomer = cluster.agent(withNode(o, "hostC"));
    newcomerJoin = startNext(*newcomer);
    awaitArrivals(cluster.store(), "job", 1, 1);
  }
};

}  // namespace

TEST_CASE("elastic: a member finished the round: a scale-up is refused, and the newcomer learns "
          "the job's end", "[rendezvous][scaleup]") {
  PairAndNewcomer s;
  auto& a = s.job[0];
  auto& b = s.job[1];
  FirstChange succeeded(*b, "succeeded");
  CHECK(a->finish());
  CHECK_FALSE(b->claimScaleUp());  // b's workers go on: the job is ending
  stillWaiting(s.newcomerJoin, 300ms);  // hostC waits: no round forms
  CHECK(b->finish());
  succeeded.get();
  REQUIRE(s.newcomerJoin.wait_for(kHang) == std::future_status::ready);
  try {
    s.newcomerJoin.get();
    FAIL("the newcomer formed a round");
  } catch (const JobEnded& e) {
    CHECK(e.exitCode() == 0);
  }
  for (auto* r : {a.get(), b.get(), s.newcomer.get()}) r->leave();
  CHECK(keysBesidesTombstone(s.cluster.store(), "job") == 0);
}

TEST_CASE("elastic: a member claimed the round for a scale-up: one that finishes after it re-forms "
          "with the others, and the round never counts as succeeded", "[rendezvous][scaleup]") {
  PairAndNewcomer s;
  auto& a = s.job[0];
  auto& b = s.job[1];
  CHECK(a->claimScaleUp());
  CHECK(a->claimScaleUp());  // the claim holds: a member asking again gets the same answer
  // b's workers succeeded after the claim, and so (while stopping) did a's: both counted in
  // `finished`, which would read "every member finished" were the claim not read with it.
  CHECK_FALSE(b->finish());
  CHECK_FALSE(a->finish());
  CHECK_FALSE(s.cluster.store().tryGet(keys::outcome("job")));
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  std::vector<RoundResult> second = {getWithin(fa), getWithin(fb), getWithin(s.newcomerJoin)};
  checkRound(second, {1, 1, 1});
  CHECK(second[0].round == 1);
  CHECK(second[0].restartCount == 0);  // a scale-up spends no restart
}

TEST_CASE("elastic: a round ending that is neither finish nor scale-up is a clear error, not a "
          "guess", "[rendezvous][scaleup]") {
  MemoryCluster cluster;
  auto [a, b] = runningPair(cluster);
  cluster.store().set(keys::ending("job", 0), "maybe\x01");
  CHECK_THROWS_WITH(a->claimScaleUp(), Catch::Contains("corrupt round ending 'maybe"));
  CHECK_THROWS_WITH(b->finish(), Catch::Contains("corrupt round ending 'maybe"));
}

TEST_CASE("elastic: short of MIN, the survivors' error counts the nodes alive, not every arrival",
          "[rendezvous]") {
  // A survivor that re-joined and then gave up is an arrival of the round but no node that
  // remains: "2 node(s) remain, fewer than the minimum of 2" said the count of arrivals.
  MemoryCluster cluster;
  auto o = options(2, 3);
  o.replaceTimeout = 300ms;
  auto impatient = o;
  impatient.joinTimeout = 200ms;
  auto a = cluster.agent(withNode(o, "hostA"));
  auto b = cluster.agent(withNode(impatient, "hostB"));
  auto c = cluster.agent(withNode(o, "hostC"));
  auto fa = startNext(*a);
  auto fb = startNext(*b);
  auto fc = startNext(*c);
  checkRound({getWithin(fa), getWithin(fb), getWithin(fc)}, {1, 1, 1});
  loseMember(*a, c);
  fb = startNext(*b);
  CHECK_THROWS_AS(getWithin(fb), TimeoutError);  // hostB re-joined round 1 and gave up
  b.reset();
  fa = startNext(*a);
  REQUIRE(fa.wait_for(kHang) == std::future_status::ready);
  CHECK_THROWS_WITH(fa.get(), Catch::Contains("; 1 node(s) remain, fewer than the minimum of 2"));
}

// comm_p2p_worker: one rank of the point-to-point tests (under build/bin/drun, or started by a
// test with RANK/WORLD_SIZE/MASTER_* set). Written for hierarchical communicators (peers on this
// host over shared memory, the others over Gloo), valid on every transport. Modes:
//   p2p            every ordered pair of ranks: three messages (tags 5, 6, 5) of sizes 0 to
//                  1 MiB+, their receives posted before the sends and after them, in a mixed
//                  order: each tag's messages in order. Rank 0 then receives from any source:
//                  alone, and after receives from given ranks: every message exactly once, each
//                  source's in order, source() right. Last, in groups {0, 1, last}, rank 0's receives
//                  from the last rank and from any rank (nobody sends) time out, the first
//                  naming it.
//   victim-p2p N   after a barrier rank N SIGKILLs itself: each survivor's pending receives (one
//                  from N, one from any rank) fail within the timeout naming N.
// Prints "rank R: ok (N checks)" and exits 0, or what went wrong and exits 1.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "drun/comm/communicator.hpp"
#include "worker_checks.hpp"

using namespace drun::comm;
using namespace std::chrono_literals;

namespace {

WorkerChecks tally;
int me = 0;

void check(bool ok, const std::string& what) { tally.check(ok, what); }

// Message `seq` of rank `src` with `tag`: its first 8 bytes say (src, seq) when there is room.
uint8_t pattern(int src, int seq, int tag, size_t i) {
  return static_cast<uint8_t>(src * 31 + seq * 7 + tag * 3 + i * 13);
}
std::vector<uint8_t> message(int src, int seq, int tag, size_t bytes) {
  std::vector<uint8_t> m(bytes);
  for (size_t i = 0; i < bytes; ++i) m[i] = pattern(src, seq, tag, i);
  if (bytes >= 8) {
    std::memcpy(m.data(), &src, 4);
    std::memcpy(m.data() + 4, &seq, 4);
  }
  return m;
}
bool isMessage(const std::vector<uint8_t>& got, int src, int seq, int tag, size_t bytes) {
  return got.size() >= bytes && std::vector<uint8_t>(got.begin(), got.begin() + static_cast<long>(bytes)) ==
                                    message(src, seq, tag, bytes);
}

// Every ordered pair: (tag 5, seq 0), (tag 6, seq 1), (tag 5, seq 2); received as tag 6 first.
void pairs(Communicator& c, size_t bytes, bool receivesFirst) {
  const int n = c.size();
  std::vector<std::vector<uint8_t>> out, in;
  std::vector<Request> sends, recvs;
  auto post = [&] {
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      for (int k = 0; k < 3; ++k) in.emplace_back(bytes + 1, 0xEE);  // one byte more: untouched
      auto base = in.size() - 3;
      recvs.push_back(c.irecv(in[base].data(), bytes, DType::UInt8, p, 6));
      recvs.push_back(c.irecv(in[base + 1].data(), bytes, DType::UInt8, p, 5));
      recvs.push_back(c.irecv(in[base + 2].data(), bytes, DType::UInt8, p, 5));
    }
  };
  if (receivesFirst) post();
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    const int tags[3] = {5, 6, 5};
    for (int k = 0; k < 3; ++k) {
      out.push_back(message(me, k, tags[k], bytes));
      sends.push_back(c.isend(out.back().data(), bytes, DType::UInt8, p, tags[k]));
    }
  }
  if (!receivesFirst) {
    c.barrier();  // the messages wait for their receives
    post();
  }
  for (size_t i = recvs.size(); i-- > 0;) recvs[i].wait();
  for (auto& s : sends) s.wait();
  size_t at = 0;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    const std::string what = "pairs " + std::to_string(bytes) + " B from rank " + std::to_string(p) +
                             (receivesFirst ? " (receives first)" : " (sends first)");
    check(isMessage(in[at], p, 1, 6, bytes) && in[at][bytes] == 0xEE, what + ": tag 6");
    check(isMessage(in[at + 1], p, 0, 5, bytes) && in[at + 1][bytes] == 0xEE, what + ": 1st of tag 5");
    check(isMessage(in[at + 2], p, 2, 5, bytes) && in[at + 2][bytes] == 0xEE, what + ": 2nd of tag 5");
    check(recvs[at].source() == p, what + ": source()");
    at += 3;
  }
}

// Every other rank sends three messages (seq 0..2) to rank 0; rank 0 receives `specific` of each
// rank's from that rank first, the rest from any source. Each message once, each rank's in order.
void anySource(Communicator& c, size_t bytes, int tag, int specific) {
  const int n = c.size();
  if (me != 0) {
    for (int k = 0; k < 3; ++k) {
      auto m = message(me, k, tag, bytes);
      c.send(m.data(), bytes, DType::UInt8, 0, tag);
    }
    return;
  }
  const int total = 3 * (n - 1);
  std::vector<std::vector<uint8_t>> in(static_cast<size_t>(total), std::vector<uint8_t>(bytes));
  std::vector<Request> recvs;
  std::vector<int> from;  // the rank asked for, or kAnySource
  for (int k = 0; k < specific; ++k)
    for (int p = 1; p < n; ++p) from.push_back(p);
  while (static_cast<int>(from.size()) < total) from.push_back(kAnySource);
  for (int i = 0; i < total; ++i)
    recvs.push_back(c.irecv(in[static_cast<size_t>(i)].data(), bytes, DType::UInt8, from[static_cast<size_t>(i)], tag));
  std::map<int, int> nextSeq;  // per source: the seq its next message must carry
  const std::string what = "any source " + std::to_string(bytes) + " B, " + std::to_string(specific) + " given first";
  for (int i = 0; i < total; ++i) {  // in posting order: each source's messages in order
    recvs[static_cast<size_t>(i)].wait();
    const int src = recvs[static_cast<size_t>(i)].source();
    int hdrSrc = -1, seq = -1;
    std::memcpy(&hdrSrc, in[static_cast<size_t>(i)].data(), 4);
    std::memcpy(&seq, in[static_cast<size_t>(i)].data() + 4, 4);
    check(src == hdrSrc && (from[static_cast<size_t>(i)] == kAnySource || from[static_cast<size_t>(i)] == src),
          what + ": receive " + std::to_string(i) + " reports source " + std::to_string(src) + ", got rank " +
              std::to_string(hdrSrc) + "'s message");
    check(seq == nextSeq[hdrSrc], what + ": rank " + std::to_string(hdrSrc) + "'s message " + std::to_string(seq) +
                                      " came when " + std::to_string(nextSeq[hdrSrc]) + " was due");
    check(isMessage(in[static_cast<size_t>(i)], hdrSrc, seq, tag, bytes), what + ": payload of receive " + std::to_string(i));
    nextSeq[hdrSrc] = seq + 1;
  }
  for (int p = 1; p < n; ++p) check(nextSeq[p] == 3, what + ": all of rank " + std::to_string(p) + "'s messages");
}

int runP2P(Communicator& c) {
  std::printf("rank %d: transport %s\n", me, c.transport().c_str());
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{8}, size_t{4099}, size_t{100003}, size_t{(1 << 20) + 5}})
    for (bool receivesFirst : {true, false}) pairs(c, bytes, receivesFirst);
  int tag = 9;
  for (size_t bytes : {size_t{8}, size_t{40000}, size_t{(1 << 20) + 3}})
    for (int specific : {0, 2}) {
      anySource(c, bytes, tag++, specific);
      c.barrier();
    }
  c.barrier();
  // Timeouts, in groups of their own (a timeout breaks its communicator): {0, 1, last} mixes
  // ranks of rank 0's host and of another on two hosts.
  const int last = c.size() - 1;
  if (last >= 2) {
    auto given = c.newGroup({0, 1, last}), any = c.newGroup({0, 1, last});
    if (me == 0) {
      uint8_t never = 0;
      const auto start = std::chrono::steady_clock::now();
      try {
        given->recv(&never, 1, DType::UInt8, 2, 999, 1500ms);
        check(false, "a receive nobody sends completed");
      } catch (const drun::TimeoutError& e) {
        check(std::string(e.what()).find("from rank 2") != std::string::npos,
              std::string("the timeout names the group's rank 2: ") + e.what());
      }
      try {
        any->recv(&never, 1, DType::UInt8, kAnySource, 998, 1500ms);
        check(false, "a receive from any source nobody sends completed");
      } catch (const drun::TimeoutError& e) {
        check(std::string(e.what()).find("timed out") != std::string::npos, std::string("any source: ") + e.what());
      }
      // A bound that catches a hang, not a timing: a loaded CI machine may run them late.
      check(std::chrono::steady_clock::now() - start < 30s, "the timeouts came (no hang)");
    }
    c.barrier();
  }
  return 0;
}

int runVictim(Communicator& c, int victim) {
  const auto timeout = 10s;
  float never = 0, neverAny = 0;
  Request fromVictim, fromAny;
  if (me != victim) {
    fromVictim = c.irecv(&never, 1, DType::Float32, victim, 77, timeout);
    fromAny = c.irecv(&neverAny, 1, DType::Float32, kAnySource, 78, timeout);
  }
  c.barrier();
  if (me == victim) kill(getpid(), SIGKILL);
  const auto start = std::chrono::steady_clock::now();
  int bad = 0;
  for (Request* r : {&fromVictim, &fromAny}) {
    const char* which = r == &fromVictim ? "receive from the victim" : "receive from any rank";
    try {
      r->wait();
      std::printf("rank %d: FAIL: the pending %s completed\n", me, which);
      ++bad;
    } catch (const drun::Error& e) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
      const bool named = std::string(e.what()).find("rank " + std::to_string(victim)) != std::string::npos;
      std::printf("rank %d: pending %s %s after %lld ms: %s\n", me, which, named ? "NAMED" : "UNNAMED",
                  static_cast<long long>(ms), e.what());
      if (!named || ms > 10000 + 3000) ++bad;
    }
  }
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "p2p";
  try {
    auto world = init();
    me = tally.rank = world->rank();
    if (mode == "p2p") {
      runP2P(*world);
    } else if (mode == "victim-p2p") {
      return runVictim(*world, argc > 2 ? std::atoi(argv[2]) : world->size() - 1);
    } else {
      std::fprintf(stderr, "comm_p2p_worker: unknown mode '%s'\n", mode.c_str());
      return 2;
    }
    world->destroy();
  } catch (const std::exception& e) {
    std::printf("rank %d: ERROR %s\n", me, e.what());
    return 1;
  }
  return tally.report();
}

// rendezvous_bench: N agents join one round of MIN=MAX=N against drun's store server; measures
// the time until every agent has its rank. Driven by
// scripts/bench/rendezvous.sh, which prints it beside torch's c10d rendezvous.
//
//   rendezvous_bench [--port P] [--host H] [--sizes 64,256,1024,4096] [--mode generator|real]
//
// --mode generator (default): one thread, one Asio io_context, N connections; each agent is a
//   coroutine speaking the wire protocol (protocol.hpp) and issuing exactly the store calls of
//   C10dRendezvous::next() for a fresh job (ExitBarrier::enter, checkJobConfig, startRound,
//   RoundJoin, RoundCloser::tryClose for the last arrival), in the same order and the same
//   batches (StoreBatch: one Batch frame, as TcpStore::runBatch sends them)
//   (keys, values, will and the closer's decision come from keys.hpp / decideRound, shared with
//   the rendezvous). Thousands of agents cost no threads.
// --mode real: N threads, each a real C10dRendezvous over its own TcpStore (cross-check of the
//   generator for small N; each agent has a heartbeat thread and later a watcher connection).
// Without --port the server runs in this process (StoreServer on its own io thread).
// Timing starts when every agent is connected and all start together; connecting is reported
// apart. rank_ms: every agent has its node rank, rank offset and master; next_ms: every agent
// also has the hosts list (= next() would return).
// --hosts-always 1: every agent also reads the hosts list whatever N (what next() did before
//   kMaxHostsInResult: the "before" rows of docs/benchmarks/rendezvous.md).
// --sequential 1: every call waits for the answer to the one before (next() before StoreBatch:
//   9 round trips per agent instead of 5; the "before" rows of the batch table in
//   docs/benchmarks/rendezvous.md).
// --server-pid P: also report the daemon's CPU time for the round (from /proc; the wall time
//   depends on what else the machine runs, the CPU time much less).
// Output: one "RESULT drun <mode> <N> <connect_ms> <rank_ms> <next_ms> <calls> <bytes> <server_cpu_ms>
// <client_cpu_ms>" (client: this process, the generator)
// per size
// (calls, bytes: store calls of all agents and their frames both ways, generator mode only;
// the handshakes are not counted).
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>

#include <algorithm>
#include <utility>

#include <boost/asio.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "drun/common/deadline.hpp"
#include "drun/common/error.hpp"
#include "drun/rendezvous/c10d_rendezvous.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/store/protocol.hpp"
#include "drun/store/store_server.hpp"
#include "drun/store/tcp_store.hpp"

namespace asio = boost::asio;
using asio::ip::tcp;
using namespace drun;
using namespace drun::rdzv;
using namespace std::chrono_literals;

namespace {

constexpr uint32_t kCallTimeoutMs = 60000;
bool gHostsAlways = false;  // --hosts-always: every agent reads the hosts list (next() before 9017153)
constexpr size_t kConnectConcurrency = 128;  // stays under the listen backlog

// CPU time (user + system) of process `pid` in ms, from /proc; 0 when it cannot be read.
double cpuMs(int pid) {
  if (pid <= 0) return 0;
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return 0;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces
  unsigned long long utime = 0, stime = 0;
  if (!p || std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
                        &stime) != 2)
    return 0;
  return 1000.0 * double(utime + stime) / double(::sysconf(_SC_CLK_TCK));
}

double msSince(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

struct Agent {
  explicit Agent(asio::io_context& io) : socket(io) {}
  tcp::socket socket;
  wire::ReceiveBuffer in;
  uint64_t nextRequest = 1;
  keys::NodeDescriptor self;
  uint64_t calls = 0;
  uint64_t bytes = 0;  // request and response frames of its calls
  Clock::time_point rankAt, doneAt;
  double decodeMs = 0;
  int nodeRank = -1;
};

// Waits for readability first, then reads: async_read_some would try a read at once, which
// (the answer not being there yet) costs an EAGAIN system call per call. Real TcpStore clients
// block in recv() on their own thread and do not pay it either.
asio::awaitable<void> readMore(Agent& a) {
  constexpr size_t kChunk = 16 * 1024;  // as TcpStore reads
  co_await a.socket.async_wait(tcp::socket::wait_read, asio::use_awaitable);
  boost::system::error_code ec;
  size_t n = a.socket.read_some(asio::buffer(a.in.prepare(kChunk), kChunk), ec);
  if (ec == asio::error::would_block) co_return;
  if (ec) throw NetworkError("read: " + ec.message());
  a.in.commit(n);
}

// The next whole message off the connection; `decode` is one of protocol.hpp's decoders.
template <typename Message, typename Decode>
asio::awaitable<Message> receive(Agent& a, Decode decode, const char* what) {
  for (;;) {
    Message m;
    auto d = decode(a.in.data(), m);
    if (d.status == wire::DecodeStatus::Bad) throw ProtocolError(std::string(what) + ": " + d.error);
    if (d.status == wire::DecodeStatus::Ok) {
      a.bytes += d.consumed;
      a.in.consume(d.consumed);
      co_return m;
    }
    co_await readMore(a);
  }
}

asio::awaitable<void> handshake(Agent& a) {
  std::string out;
  wire::Hello hello;
  hello.leaseMs = 60000;
  wire::encodeHello(hello, out);
  co_await asio::async_write(a.socket, asio::buffer(out), asio::use_awaitable);
  auto reply = co_await receive<wire::HelloReply>(
      a, [](std::string_view in, wire::HelloReply& m) { return wire::decodeHelloReply(in, m); },
      "hello");
  if (reply.status != wire::HelloStatus::Ok) throw ProtocolError("hello refused");
  a.bytes = 0;  // only the calls count
}

// One call, answered in order (one in flight per connection, as TcpStore does).
asio::awaitable<wire::Response> call(Agent& a, wire::Request q) {
  q.id = a.nextRequest++;
  std::string out;
  wire::encodeRequest(q, out);
  co_await asio::async_write(a.socket, asio::buffer(out), asio::use_awaitable);
  ++a.calls;
  a.bytes += out.size();
  for (;;) {
    auto r = co_await receive<wire::Response>(
        a, [](std::string_view in, wire::Response& m) { return wire::decodeResponse(in, m); },
        "response");
    if (r.id != q.id) continue;
    if (r.status != wire::Status::Ok)
      throw Error(std::string(wire::toString(q.op)) + ": " + r.message);
    co_return r;
  }
}

// Several independent calls, as TcpStore::runBatch sends a StoreBatch: two or more as one Batch
// frame (protocol version 3), in one write, then the answers in order. With --sequential 1, one call after another (next()
// before batches).
bool gSequential = false;

asio::awaitable<std::vector<wire::Response>> callBatch(Agent& a, std::vector<wire::Request> qs) {
  std::vector<wire::Response> answers;
  if (gSequential) {
    for (auto& q : qs) answers.push_back(co_await call(a, std::move(q)));
    co_return answers;
  }
  std::string out;
  for (auto& q : qs) {
    q.id = a.nextRequest++;
    wire::encodeRequest(q, out);
  }
  if (qs.size() > 1) {
    std::string batch;
    wire::encodeBatch(out, a.nextRequest++, batch);
    out = std::move(batch);
  }
  co_await asio::async_write(a.socket, asio::buffer(out), asio::use_awaitable);
  a.calls += qs.size();
  a.bytes += out.size();
  for (const auto& q : qs) {
    auto r = co_await receive<wire::Response>(
        a, [](std::string_view in, wire::Response& m) { return wire::decodeResponse(in, m); },
        "response");
    if (r.id != q.id) throw ProtocolError("answer out of order");
    if (r.status != wire::Status::Ok)
      throw Error(std::string(wire::toString(q.op)) + ": " + r.message);
    answers.push_back(std::move(r));
  }
  co_return answers;
}

// Request builders: plain functions, since GCC 12 rejects braced lists inside coroutines.
wire::Request request(wire::Op op, const std::string& key) {
  wire::Request q;
  q.op = op;
  q.keys.push_back(key);
  return q;
}

wire::Request request(wire::Op op, const std::string& key, const Bytes& value) {
  wire::Request q = request(op, key);
  q.values.push_back(value);
  return q;
}

wire::Request compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  wire::Request q = request(wire::Op::CompareSet, key, expected);
  q.values.push_back(desired);
  return q;
}

wire::Request multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  wire::Request q;
  q.op = wire::Op::MultiSet;
  q.keys = keys;
  q.values = values;
  return q;
}

std::string jobConfig(int n) {
  keys::JobConfig c;
  c.minNodes = c.maxNodes = n;
  c.setBy = "node0";
  return keys::encodeJobConfig(c);
}

asio::awaitable<std::optional<Bytes>> tryGet(Agent& a, const std::string& key) {
  auto r = co_await call(a, request(wire::Op::TryGet, key));
  co_return r.values.empty() ? std::nullopt : std::optional<Bytes>(r.values[0]);
}

// The closer's part of C10dRendezvous::tryClose for MIN=MAX=n.
asio::awaitable<void> close(Agent& a, const std::string& runId, int n) {
  const int64_t left = keys::parseCounter(co_await tryGet(a, keys::left(runId, 0))).value_or(0);
  const int64_t changes =
      keys::parseCounter(co_await tryGet(a, keys::changes(runId, 0))).value_or(0);
  auto nodes = keys::parseJoined((co_await tryGet(a, keys::joined(runId, 0))).value_or(""));
  if (changes > 0) {
    std::vector<keys::NodeDescriptor> alive;
    for (auto& node : nodes)
      if (!co_await tryGet(a, keys::dead(runId, 0, node.id))) alive.push_back(node);
    nodes.swap(alive);
  }
  // `left` again: the snapshot agrees with it (RoundCloser's look).
  if (keys::parseCounter(co_await tryGet(a, keys::left(runId, 0))).value_or(0) != left)
    throw Error("a will ran during the bench's close");
  co_await tryGet(a, keys::refill(runId));  // restartCountFor: a refilled store's count
  if (static_cast<int>(nodes.size()) < n) co_return;
  nodes.resize(n);
  RoundDecision d = decideRound(runId, 0, nodes, {changes, left});
  auto cas = co_await call(a, compareSet(keys::state(runId, 0), "", d.decision));
  if (cas.values.at(0) == d.decision) co_await call(a, multiSet(d.keys, d.values));
}

// C10dRendezvous::next() of a fresh agent in a job of MIN=MAX=n.
asio::awaitable<void> join(Agent& a, const std::string& runId, int n) {
  // ExitBarrier::enter, then checkJobConfig, then startRound.
  // (C10dRendezvous::enterJob: the outcome alone, then config and round in one batch;
  // RoundJoin::run: will, present, joined and count in one batch.)
  if (co_await tryGet(a, keys::outcome(runId))) throw Error("stale outcome");
  std::vector<wire::Request> entry;
  entry.push_back(compareSet(keys::config(runId), "", jobConfig(n)));
  entry.push_back(request(wire::Op::TryGet, keys::currentRound(runId)));
  if (!(co_await callBatch(a, std::move(entry)))[1].values.empty()) throw Error("not a fresh job");
  std::vector<wire::Request> joining;
  joining.emplace_back();
  joining.back().op = wire::Op::SetWill;
  joining.back().will = keys::joinWill(runId, 0, a.self.id, a.self.displayName());
  joining.push_back(request(wire::Op::Add, keys::present(runId)));
  joining.back().delta = 1;
  joining.push_back(request(wire::Op::Append, keys::joined(runId, 0), keys::encodeDescriptor(a.self)));
  joining.push_back(request(wire::Op::Add, keys::count(runId, 0)));
  joining.back().delta = 1;
  if ((co_await callBatch(a, std::move(joining)))[3].number >= n) co_await close(a, runId, n);

  std::optional<keys::RoundState> state;
  std::optional<Bytes> known;
  while (!(known && (state = keys::parseState(*known)))) {
    auto q = request(wire::Op::Watch, keys::status(runId, 0));
    q.known = known;
    q.timeoutMs = kCallTimeoutMs;
    auto r = co_await call(a, std::move(q));
    known = r.values.empty() ? std::nullopt : std::optional<Bytes>(r.values[0]);
  }
  if (!state->ok) throw Error("round failed: " + state->error);
  // RoundJoin::seat: the assignment and the next round's status, in one batch.
  std::vector<wire::Request> seat;
  seat.push_back(request(wire::Op::TryGet, keys::assign(runId, 0, a.self.id)));
  seat.push_back(request(wire::Op::TryGet, keys::status(runId, 1)));
  auto seated = co_await callBatch(a, std::move(seat));
  if (seated[0].values.empty()) throw Error("agent " + a.self.id + " left out of the round");
  a.nodeRank = keys::parseAssignment(seated[0].values[0]).nodeRank;
  a.rankAt = Clock::now();
  if (n > kMaxHostsInResult && !gHostsAlways) {  // RoundResult::hosts stays empty (O(N^2) bytes)
    a.doneAt = a.rankAt;
    co_return;
  }
  // The hosts list (RoundResult::hosts). Each real agent decodes it on its own host, in
  // parallel with the others; here one thread plays every agent, so only the first decodes it
  // (checked and timed: decodeMs), the others just receive the same bytes.
  auto q = request(wire::Op::Get, keys::hosts(runId, 0));
  q.timeoutMs = kCallTimeoutMs;
  auto hosts = co_await call(a, std::move(q));
  if (a.self.id == "a0") {
    const auto t0 = Clock::now();
    if (keys::parseHostList(hosts.values.at(0), n).size() != static_cast<size_t>(n))
      throw Error("bad hosts list");
    a.decodeMs = msSince(t0, Clock::now());
  }
  a.doneAt = Clock::now();
}

struct Result {
  double connectMs = 0, rankMs = 0, doneMs = 0;
  uint64_t calls = 0;
  uint64_t bytes = 0;
  double serverCpuMs = 0;  // the daemon's CPU time from all-connected to every agent done
  double clientCpuMs = 0;  // this process' (the generator's) over the same span
};

Result runGenerator(const std::string& host, uint16_t port, int n, const std::string& runId,
                    int serverPid) {
  asio::io_context io(1);
  std::vector<std::unique_ptr<Agent>> agents;
  for (int i = 0; i < n; ++i) {
    auto a = std::make_unique<Agent>(io);
    a->self.id = "a" + std::to_string(i);
    a->self.host = "node" + std::to_string(i);
    a->self.addr = "10.0." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1);
    a->self.localWorldSize = 8;
    a->self.masterPort = static_cast<uint16_t>(20000 + i);
    agents.push_back(std::move(a));
  }
  std::exception_ptr failure;
  auto onDone = [&](std::exception_ptr e) {
    if (e && !failure) failure = e;
  };
  const tcp::endpoint endpoint(asio::ip::make_address(host), port);

  // Connect with bounded concurrency (a burst of SYNs over the backlog costs 1 s retries).
  const auto t0 = Clock::now();
  size_t nextToConnect = 0;
  for (size_t w = 0; w < std::min<size_t>(kConnectConcurrency, agents.size()); ++w)
    asio::co_spawn(io, [&]() -> asio::awaitable<void> {
      while (nextToConnect < agents.size()) {
        Agent& a = *agents[nextToConnect++];
        co_await a.socket.async_connect(endpoint, asio::use_awaitable);
        a.socket.set_option(tcp::no_delay(true));
        co_await handshake(a);
      }
    }, onDone);
  io.run();
  if (failure) std::rethrow_exception(failure);
  const auto t1 = Clock::now();

  io.restart();
  const double cpu0 = cpuMs(serverPid);
  const double self0 = cpuMs(::getpid());
  for (auto& a : agents) asio::co_spawn(io, join(*a, runId, n), onDone);
  io.run();
  if (failure) std::rethrow_exception(failure);

  Result r;
  r.serverCpuMs = cpuMs(serverPid) - cpu0;
  r.clientCpuMs = cpuMs(::getpid()) - self0;
  r.connectMs = msSince(t0, t1);
  std::vector<bool> seen(n);
  for (auto& a : agents) {
    r.rankMs = std::max(r.rankMs, msSince(t1, a->rankAt));
    r.doneMs = std::max(r.doneMs, msSince(t1, a->doneAt));
    r.calls += a->calls;
    r.bytes += a->bytes;
    if (a->nodeRank < 0 || a->nodeRank >= n || seen[a->nodeRank])
      throw Error("bad node rank " + std::to_string(a->nodeRank));
    seen[a->nodeRank] = true;
  }
  // Clean up the job's keys so that the next size starts from a small store.
  io.restart();
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    co_await call(*agents[0], request(wire::Op::DeletePrefix, keys::job(runId)));
  }, onDone);
  io.run();
  return r;
}

Result runReal(const std::string& host, uint16_t port, int n, const std::string& runId) {
  RendezvousOptions o;
  o.runId = runId;
  o.minNodes = o.maxNodes = n;
  o.localWorldSize = 8;
  o.joinTimeout = 120s;
  TcpStoreOptions client;
  client.host = host;
  client.port = port;
  client.connectTimeout = 30s;
  const auto t0 = Clock::now();
  std::vector<std::unique_ptr<Rendezvous>> agents;
  for (int i = 0; i < n; ++i) {
    C10dStoreAccess access;
    access.store = std::make_unique<TcpStore>(client);
    access.selfAddress = "127.0.0.1";
    auto options = o;
    options.localAddr = "node" + std::to_string(i);
    agents.push_back(makeC10dRendezvous(options, std::move(access)));
  }
  const auto t1 = Clock::now();
  std::vector<Clock::time_point> done(n);
  std::vector<int> ranks(n, -1);
  std::latch start(n + 1);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      ranks[i] = agents[i]->next().nodeRank;
      done[i] = Clock::now();
    });
  const auto t2 = Clock::now();
  start.arrive_and_wait();
  for (auto& t : threads) t.join();
  Result r;
  r.connectMs = msSince(t0, t1);
  for (auto& d : done) r.rankMs = std::max(r.rankMs, msSince(t2, d));
  r.doneMs = r.rankMs;  // next() returns with both
  for (auto& a : agents) a->leave();
  return r;
}

void raiseFileLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

int usage() {
  std::cerr << "usage: rendezvous_bench [--host H] [--port P] [--sizes 64,256,...] "
               "[--mode generator|real]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string host = "127.0.0.1", mode = "generator";
  int port = -1;
  int serverPid = 0;
  std::vector<int> sizes = {64, 256, 1024, 4096};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (i + 1 >= argc) return usage();
    std::string value = argv[++i];
    if (arg == "--host") {
      host = value;
    } else if (arg == "--hosts-always") {
      gHostsAlways = value == "1";
    } else if (arg == "--sequential") {
      gSequential = value == "1";
    } else if (arg == "--server-pid") {
      serverPid = std::atoi(value.c_str());
    } else if (arg == "--port") {
      port = std::atoi(value.c_str());
    } else if (arg == "--mode" && (value == "generator" || value == "real")) {
      mode = value;
    } else if (arg == "--sizes") {
      sizes.clear();
      for (size_t p = 0; p < value.size();) {
        size_t comma = value.find(',', p);
        if (comma == std::string::npos) comma = value.size();
        int n = std::atoi(value.substr(p, comma - p).c_str());
        if (n < 1) return usage();
        sizes.push_back(n);
        p = comma + 1;
      }
    } else {
      return usage();
    }
  }
  raiseFileLimit();
  std::unique_ptr<StoreServer> server;
  if (port < 0) {
    StoreServerOptions so;
    so.host = host;
    so.port = 0;
    server = std::make_unique<StoreServer>(so);
    server->start();
    port = server->port();
  }
  try {
    int run = 0;
    for (int n : sizes) {
      const std::string runId = "bench-" + std::to_string(::getpid()) + "-" + std::to_string(run++);
      Result r = mode == "real" ? runReal(host, static_cast<uint16_t>(port), n, runId)
                                : runGenerator(host, static_cast<uint16_t>(port), n, runId,
                                               serverPid);
      std::printf("RESULT drun %s %d %.1f %.1f %.1f %llu %llu %.0f %.0f\n", mode.c_str(), n,
                  r.connectMs, r.rankMs, r.doneMs, static_cast<unsigned long long>(r.calls),
                  static_cast<unsigned long long>(r.bytes), r.serverCpuMs, r.clientCpuMs);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rendezvous_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}

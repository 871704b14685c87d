// One generated agent of rendezvous_bench's generator mode: a coroutine speaking the wire
// protocol (protocol.hpp) that issues exactly the store calls of C10dRendezvous::next() for a
// fresh job, in the same order and the same batches (rendezvous_bench.cpp says more).
#pragma once

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "drun/common/deadline.hpp"
#include "drun/common/error.hpp"
#include "drun/rendezvous/c10d_rendezvous.hpp"
#include "drun/rendezvous/keys.hpp"
#include "drun/store/protocol.hpp"

namespace drun::rdzv::bench {

namespace asio = boost::asio;
using asio::ip::tcp;

inline constexpr uint32_t kCallTimeoutMs = 60000;
inline bool gHostsAlways = false;  // --hosts-always: every agent reads the hosts list (the reads an agent made before the hosts list was read only when it changed)

inline double msSince(Clock::time_point t0, Clock::time_point t1) {
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
inline asio::awaitable<void> readMore(Agent& a) {
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
inline asio::awaitable<Message> receive(Agent& a, Decode decode, const char* what) {
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

inline asio::awaitable<void> handshake(Agent& a) {
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
inline asio::awaitable<wire::Response> call(Agent& a, wire::Request q) {
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
inline bool gSequential = false;

inline asio::awaitable<std::vector<wire::Response>> callBatch(Agent& a, std::vector<wire::Request> qs) {
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
inline wire::Request request(wire::Op op, const std::string& key) {
  wire::Request q;
  q.op = op;
  q.keys.push_back(key);
  return q;
}

inline wire::Request request(wire::Op op, const std::string& key, const Bytes& value) {
  wire::Request q = request(op, key);
  q.values.push_back(value);
  return q;
}

inline wire::Request compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  wire::Request q = request(wire::Op::CompareSet, key, expected);
  q.values.push_back(desired);
  return q;
}

inline wire::Request multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  wire::Request q;
  q.op = wire::Op::MultiSet;
  q.keys = keys;
  q.values = values;
  return q;
}

inline std::string jobConfig(int n) {
  keys::JobConfig c;
  c.minNodes = c.maxNodes = n;
  c.setBy = "node0";
  return keys::encodeJobConfig(c);
}

inline asio::awaitable<std::optional<Bytes>> tryGet(Agent& a, const std::string& key) {
  auto r = co_await call(a, request(wire::Op::TryGet, key));
  co_return r.values.empty() ? std::nullopt : std::optional<Bytes>(r.values[0]);
}

// The closer's part of C10dRendezvous::tryClose for MIN=MAX=n.
inline asio::awaitable<void> close(Agent& a, const std::string& runId, int n) {
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
inline asio::awaitable<void> join(Agent& a, const std::string& runId, int n) {
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

}  // namespace drun::rdzv::bench

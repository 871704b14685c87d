// StoreServer: Boost.Asio, C++20 coroutines, one io thread. See store_server.hpp for the rules.
//
// This file: listening, admission (the pending set and its cap), the orphan sweep, start/stop,
// statistics. A connection is a Session (store_session.hpp): its phase, reader, writer and
// deadlines; its blocking calls are a BlockingCalls (blocking_calls.hpp). Nothing ever blocks on
// a socket, so a slow or hostile client only ever delays itself.
#include "drun/store/store_server.hpp"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <atomic>
#include <cstring>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <map>
#include <thread>

#include "drun/common/error.hpp"
#include "drun/common/log.hpp"
#include "drun/common/resolve.hpp"
#include "drun/common/owned_thread.hpp"
#include "server_state.hpp"
#include "store_session.hpp"

namespace drun::rdzv {
namespace {

using server::asio::awaitable;
namespace asio = server::asio;
using tcp = server::tcp;

void raiseFileLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur >= limit.rlim_max) return;
  rlimit raised = limit;
  raised.rlim_cur = limit.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &raised) == 0)
    spdlog::debug("store server: RLIMIT_NOFILE soft limit {} -> {}", limit.rlim_cur,
                  raised.rlim_cur);
}

}  // namespace

class StoreServer::Impl {
 public:
  explicit Impl(const StoreServerOptions& options);
  void start();
  void run();
  void stop();

  server::ServerState state_;
  tcp::acceptor acceptor_{state_.ioc};
  asio::steady_timer acceptRetry_{state_.ioc};
  asio::steady_timer sweepTimer_{state_.ioc};
  uint16_t port_ = 0;
  uint64_t lastSession_ = 0;
  std::atomic<bool> stopRequested_{false};
  std::atomic<bool> running_{false};
  std::thread thread_;
  std::map<std::string, std::chrono::steady_clock::time_point> orphanSince_;  // io thread only

  awaitable<void> acceptLoop();
  void admitPending(tcp::socket socket);
  awaitable<void> sweepLoop();
  void sweepOrphans();
  void closeAll();
};

StoreServer::Impl::Impl(const StoreServerOptions& options) : state_(options) {
  raiseFileLimit();
  const StoreServerOptions& o = state_.options;
  const HostPort address{o.listen.host.empty() ? "0.0.0.0" : o.listen.host, o.listen.port};
  const std::string where = address.toString();
  // The address to listen on: a host name is resolved within net::kResolveTimeout.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  net::Resolved resolved = net::resolve(address.host, std::to_string(address.port), hints);
  if (!resolved.addresses) throw NetworkError("store server: cannot listen on " + where + ": " + resolved.error);
  tcp::endpoint endpoint;
  const addrinfo& first = *resolved.addresses;
  if (first.ai_addrlen > endpoint.capacity())
    throw NetworkError("store server: cannot listen on " + where + ": unexpected address size");
  std::memcpy(endpoint.data(), first.ai_addr, first.ai_addrlen);
  endpoint.resize(first.ai_addrlen);
  try {
    acceptor_.open(endpoint.protocol());
    acceptor_.set_option(tcp::acceptor::reuse_address(true));
    acceptor_.bind(endpoint);
    acceptor_.listen(asio::socket_base::max_listen_connections);
    port_ = acceptor_.local_endpoint().port();
  } catch (const boost::system::system_error& e) {
    const bool isErrno = e.code().category() == boost::system::system_category();
    throw NetworkError("store server: cannot listen on " + where + ": " + e.code().message(),
                       isErrno ? e.code().value() : 0);
  }
  auto report = [](const char* what) {
    return [what](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        spdlog::error("store server: {} failed: {}", what, ex.what());
      }
    };
  };
  asio::co_spawn(state_.ioc, acceptLoop(), report("accept loop"));
  if (o.orphanTtl.count() > 0) asio::co_spawn(state_.ioc, sweepLoop(), report("orphan sweep"));
}

// Removes the jobs no agent's will has named for orphanTtl (all their agents died); runs on the
// io thread every quarter of the TTL.
awaitable<void> StoreServer::Impl::sweepLoop() {
  const auto period = std::max<milliseconds>(milliseconds(50), state_.options.orphanTtl / 4);
  boost::system::error_code ec;
  while (!state_.stopping) {
    sweepTimer_.expires_after(period);
    co_await sweepTimer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (state_.stopping) co_return;
    sweepOrphans();
  }
}

void StoreServer::Impl::sweepOrphans() {
  const auto now = std::chrono::steady_clock::now();
  std::map<std::string, std::chrono::steady_clock::time_point> still;
  const StoreServerOptions& o = state_.options;
  for (std::string& job : state_.core.prefixesWithoutWill(o.orphanRoot)) {
    auto since = orphanSince_.count(job) ? orphanSince_[job] : now;
    if (now - since < o.orphanTtl) {
      still.emplace(std::move(job), since);
      continue;
    }
    const int64_t removed = state_.core.erasePrefix(job);
    state_.counters.orphansRemoved++;
    state_.noteWaiters();
    state_.noteStored();
    spdlog::info("store server: removed {} key(s) of {} (no agent of it left for {}ms)", removed,
                 job, o.orphanTtl.count());
  }
  orphanSince_ = std::move(still);
}

awaitable<void> StoreServer::Impl::acceptLoop() {
  boost::system::error_code ec;
  while (!state_.stopping) {
    tcp::socket socket(state_.ioc);
    co_await acceptor_.async_accept(socket, asio::redirect_error(asio::use_awaitable, ec));
    if (state_.stopping) co_return;
    if (ec) {
      // Out of descriptors or a transient network error: back off instead of spinning; the
      // connections already open are unaffected.
      spdlog::warn("store server: accept on port {} failed: {}; retrying", port_, ec.message());
      acceptRetry_.expires_after(std::chrono::milliseconds(50));
      co_await acceptRetry_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    admitPending(std::move(socket));
  }
}

// A new connection joins the pending set (Hello, then Auth); the connection caps apply at its
// hello. At maxPendingConnections the oldest pending one is dropped to make room: a crowd that
// never finishes its handshake only ever displaces itself, never an admitted member.
void StoreServer::Impl::admitPending(tcp::socket socket) {
  boost::system::error_code ec;
  socket.set_option(tcp::no_delay(true), ec);
  auto remote = socket.remote_endpoint(ec);
  std::string address = ec ? std::string("?") : remote.address().to_string();
  const size_t cap = std::max<size_t>(1, state_.options.maxPendingConnections);
  while (state_.handshaking.size() >= cap) {
    auto oldest = state_.sessions.find(*state_.handshaking.begin());
    if (oldest == state_.sessions.end()) {
      state_.handshaking.erase(state_.handshaking.begin());  // not expected: a closed one
      continue;
    }
    std::shared_ptr<server::Session> victim = oldest->second;
    state_.counters.pendingEvicted++;
    victim->close("dropped for a newer connection: " + std::to_string(cap) +
                  " connections were in their handshake (maxPendingConnections)");
  }
  state_.counters.accepted++;
  state_.counters.open++;
  const uint64_t id = ++lastSession_;
  auto session = std::make_shared<server::Session>(state_, std::move(socket), id, address);
  state_.sessions.emplace(id, session);
  state_.handshaking.insert(id);
  state_.counters.pending = state_.handshaking.size();
  session->begin();
}

void StoreServer::Impl::closeAll() {
  state_.stopping = true;
  boost::system::error_code ec;
  acceptor_.close(ec);
  acceptRetry_.cancel();
  sweepTimer_.cancel();
  std::vector<std::shared_ptr<server::Session>> all;
  for (auto& [id, s] : state_.sessions) all.push_back(s);
  for (auto& s : all) s->close("server stopping");
}

void StoreServer::Impl::start() {
  if (running_.exchange(true)) throw std::logic_error("StoreServer already running");
  // Before the thread exists, so that creating the registry never races with the server
  // thread's first log line (a worker that hosts its communicator's store logs from both).
  log::ensureRegistry();
  thread_ = spawnThreadWithSignalsBlocked([this] { state_.ioc.run(); });
}

void StoreServer::Impl::run() {
  if (running_.exchange(true)) throw std::logic_error("StoreServer already running");
  state_.ioc.run();
}

void StoreServer::Impl::stop() {
  if (!stopRequested_.exchange(true)) {
    if (running_) {
      asio::post(state_.ioc, [this] { closeAll(); });
    } else {
      closeAll();  // never served: nothing runs concurrently
      state_.ioc.run();  // let the cancelled accept loop finish
    }
  }
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
}

// ---------------------------------------------------------------------------------- StoreServer

StoreServer::StoreServer(const StoreServerOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}

StoreServer::~StoreServer() { stop(); }

uint16_t StoreServer::port() const { return impl_->port_; }
const std::string& StoreServer::host() const { return impl_->state_.options.listen.host; }
void StoreServer::start() { impl_->start(); }
void StoreServer::run() { impl_->run(); }
void StoreServer::stop() { impl_->stop(); }

void StoreServer::attach(const std::function<void(boost::asio::io_context&, StoreCore&)>& attach) {
  if (impl_->running_) throw std::logic_error("StoreServer::attach after start");
  attach(impl_->state_.ioc, impl_->state_.core);
}

StoreServerStats StoreServer::stats() const {
  const server::Counters& c = impl_->state_.counters;
  StoreServerStats s;
  s.connectionsAccepted = c.accepted;
  s.connectionsOpen = c.open;
  s.requestsServed = c.requests;
  s.protocolErrors = c.protocolErrors;
  s.leasesExpired = c.leasesExpired;
  s.slowClientsDropped = c.slowDropped;
  s.willsRun = c.wills;
  s.waitersPending = c.waiters;
  s.orphanJobsRemoved = c.orphansRemoved;
  s.connectionsRefused = c.refused;
  s.stalledDropped = c.stalled;
  s.inputBytesBuffered = c.inputBuffered;
  s.authRefused = c.authRefused;
  s.connectionsPending = c.pending;
  s.pendingEvicted = c.pendingEvicted;
  s.handshakesExpired = c.handshakesExpired;
  s.outputBytesQueued = c.outputQueued;
  s.callBytesHeld = c.callBytes;
  s.storedBytes = c.storedBytes;
  s.overBudget = c.overBudget;
  return s;
}

std::optional<std::chrono::steady_clock::time_point> StoreServer::lastWillRun() const {
  const int64_t ticks = impl_->state_.counters.lastWillRun;
  if (ticks == 0) return std::nullopt;
  return std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(ticks));
}

}  // namespace drun::rdzv

// The Gloo backend: Gloo's TCP transport, one full-mesh context per communicator, connected
// through drun's store (GlooStoreAdapter). Only Gloo's functional API (gloo::allreduce(opts) ...)
// and unbound buffers are used on a context: mixing in the classic algorithm classes shrinks the
// pairs' socket buffers and slows a context by more than an order of magnitude (docs in
// shared/reference).
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/gather.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/scatter.h>
#include <gloo/transport/tcp/device.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <exception>
#include <cstring>
#include <mutex>
#include <numeric>
#include <vector>

#include "../backend.hpp"
#include "../reduce.hpp"
#include "drun/common/deadline.hpp"
#include "drun/common/env.hpp"
#include "gloo/abortable_context.hpp"
#include "gloo/gloo_p2p.hpp"
#include "gloo/store_adapter.hpp"

namespace drun::comm::detail {

// Gloo's errors as drun's: its timeouts (an IoException saying "Timed out") as TimeoutError,
// every other transport failure as CommError. Call from a catch block.
[[noreturn]] void rethrowGlooAsDrun() {
  try {
    throw;
  } catch (const gloo::IoException& e) {
    std::string msg = std::string("gloo: ") + e.what();
    if (msg.find("Timed out") != std::string::npos) throw TimeoutError(msg);
    throw CommError(msg);
  } catch (const gloo::EnforceNotMet& e) {
    throw CommError(std::string("gloo: ") + e.what());
  } catch (const gloo::Exception& e) {
    throw CommError(std::string("gloo: ") + e.what());
  }
}

namespace {

// Point-to-point slots live above every collective prefix Gloo uses (0x01..0x08 << 56).
constexpr uint64_t kP2PSlotBase = uint64_t{0xD0} << 56;
uint64_t p2pSlot(int tag) { return kP2PSlotBase | static_cast<uint32_t>(tag); }

// The local address whose route reaches `host` (a connected UDP socket sends nothing).
std::string addressRouting(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "9", &hints, &res); rc != 0)
    throw InvalidArgument("cannot resolve MASTER_ADDR '" + host + "': " + gai_strerror(rc));
  std::string result;
  for (addrinfo* ai = res; ai && result.empty(); ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* addr = local.ss_family == AF_INET6
                             ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                             : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
      if (inet_ntop(local.ss_family, addr, text, sizeof(text))) result = text;
    }
    close(fd);
  }
  freeaddrinfo(res);
  if (result.empty()) throw NetworkError("no local address routes to MASTER_ADDR '" + host + "'");
  return result;
}

// Gloo aborts the process (an exception on its own event-loop thread) when a message is larger
// than the buffer posted for it: ranks that passed different counts. Say so before dying; with
// DRUN_COMM_CHECK=1 the front end catches the mismatch as an InvalidArgument instead.
void explainGlooAborts() {
  static std::once_flag once;
  std::call_once(once, [] {
    static std::terminate_handler previous = std::set_terminate([] {
      if (auto error = std::current_exception()) {
        try {
          std::rethrow_exception(error);
        } catch (const gloo::EnforceNotMet& e) {
          std::fprintf(stderr,
                       "drun_comm: fatal: Gloo received a message larger than the buffer posted for "
                       "it: the ranks passed different sizes to a collective or to send/recv. Set "
                       "DRUN_COMM_CHECK=1 to get an error naming the call and the ranks instead. (%s)\n",
                       e.what());
        } catch (...) {
        }
      }
      if (previous) previous();
      std::abort();
    });
  });
}

// Gloo writes to its sockets without MSG_NOSIGNAL, from its own and from the caller's threads: a
// peer that died would kill this process with SIGPIPE instead of failing the operation. A
// process still at SIGPIPE's default gets SIG_IGN (as Python and drun itself do); a handler the
// program installed is left alone.
void ignoreSigpipeAtDefault() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && !(current.sa_flags & SA_SIGINFO) &&
      current.sa_handler == SIG_DFL)
    std::signal(SIGPIPE, SIG_IGN);
}

}  // namespace

std::shared_ptr<gloo::transport::Device> makeGlooDevice(const BackendConfig& config) {
  explainGlooAborts();
  ignoreSigpipeAtDefault();
  gloo::transport::tcp::attr attr;
  std::string ifname = config.socketIfname;
  if (ifname.empty()) ifname = env::getString("DRUN_SOCKET_IFNAME");
  if (ifname.empty()) ifname = env::get("GLOO_SOCKET_IFNAME").value_or("");
  if (!ifname.empty()) {
    attr.iface = ifname;
  } else if (!config.masterAddr.empty()) {
    attr.hostname = addressRouting(config.masterAddr);
  } else {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    attr.hostname = name;
  }
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw InvalidArgument("gloo: cannot use interface '" + (ifname.empty() ? attr.hostname : ifname) +
                          "': " + e.what());
  }
}

// Calls f(T{}) with an unsigned carrier type as wide as one element: Gloo's typed setters only
// use sizeof(T), the reduce callback knows the real type.
template <class F>
void withCarrier(DType dtype, F&& f) {
  switch (dtypeSize(dtype)) {
    case 1: return f(uint8_t{});
    case 2: return f(uint16_t{});
    case 4: return f(uint32_t{});
    default: return f(uint64_t{});
  }
}

namespace {

// A pair's initial connect is bounded by 5x this (Gloo's multiple).
constexpr milliseconds kPairConnectSlice{2000};

class GlooBackend final : public Backend {
 public:
  GlooBackend(std::shared_ptr<gloo::transport::Device> device, std::shared_ptr<rdzv::Store> store,
              int rank, int size, milliseconds timeout)
      : device_(std::move(device)), poller_(std::make_shared<GlooPoller>()) {
    auto context = std::make_shared<AbortableGlooContext>(rank, size);
    // A pair's initial connect waits up to 5x the context's timeout, and nothing interrupts it: a
    // peer that abandoned this generation (superseded while forming: its pairs are gone) would
    // hold this rank there for five times the whole reform's deadline. The connects get a slice
    // instead: a peer's pair exists once its address is in the store, so its handshake takes
    // milliseconds; a connect past the slice fails, and reform() moves to the newer generation.
    context->setTimeout(std::min(timeout, kPairConnectSlice));
    GlooStoreAdapter adapter(std::move(store), timeout);
    try {
      context->connectFullMesh(adapter, device_);
      context->setTimeout(timeout);
      context->makeAbortable();
      // connectFullMesh returns on a rank once its own side of each pair is up: a rank whose
      // peers all connected quickly could finish, destroy its pairs and exit while a slower rank
      // still completes a handshake with it, and that rank's init then fails with "Connection
      // closed by peer". No rank leaves init before every mesh is up.
      gloo::BarrierOptions opts(context);
      limit(opts, nextTag_++, timeout);
      gloo::barrier(opts);
    } catch (const Error&) {
      throw;
    } catch (...) {
      rethrowGlooAsDrun();
    }
    context_ = std::move(context);
  }

  void run(const Collective& c) override {
    const uint32_t tag = nextTag_++;
    try {
      dispatch(c, tag);
    } catch (const Error&) {
      throw;
    } catch (...) {
      rethrowGlooAsDrun();
    }
  }

  void dispatch(const Collective& c, uint32_t tag) {
    withCarrier(c.dtype, [&](auto carrier) {
      using T = decltype(carrier);
      switch (c.kind) {
        case OpKind::Broadcast: return broadcast<T>(c, tag);
        case OpKind::Reduce: return reduce<T>(c, tag);
        case OpKind::AllReduce: return allReduce<T>(c, tag);
        case OpKind::Scatter: return scatter<T>(c, tag);
        case OpKind::Gather: return gather<T>(c, tag);
        case OpKind::AllGather: return allGather<T>(c, tag);
        case OpKind::ReduceScatter: return reduceScatter<T>(c, tag);
        case OpKind::AllToAll: return allToAll<T>(c, static_cast<const T*>(c.send),
                                                  static_cast<T*>(c.recv), c.timeout, tag);
        case OpKind::Barrier: return barrier(c, tag);
      }
    });
  }

  std::shared_ptr<Request::State> isend(const void* buf, size_t bytes, int dst, int tag,
                                        milliseconds timeout) override {
    return post(std::make_shared<GlooP2P>(*context_, const_cast<void*>(buf), bytes, true, timeout, poller_,
                                          "send to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) + ")"),
                [&](gloo::transport::UnboundBuffer& b) { b.send(dst, p2pSlot(tag)); });
  }

  std::shared_ptr<Request::State> irecv(void* buf, size_t bytes, int src, int tag,
                                        milliseconds timeout) override {
    return post(std::make_shared<GlooP2P>(*context_, buf, bytes, false, timeout, poller_,
                                          "recv from " + (src == kAnySource ? std::string("any rank") : "rank " + std::to_string(src)) +
                                              " (tag " + std::to_string(tag) + ")"),
                [&](gloo::transport::UnboundBuffer& b) {
                  if (src != kAnySource) return b.recv(src, p2pSlot(tag));
                  std::vector<int> others;
                  for (int r = 0; r < context_->size; ++r)
                    if (r != context_->rank) others.push_back(r);
                  b.recv(others, p2pSlot(tag));
                });
  }

  std::shared_ptr<Request::State> irecvFromAnyOf(void* buf, size_t bytes, const std::vector<int>& sources, int tag,
                                                 milliseconds timeout) override {
    return post(std::make_shared<GlooP2P>(*context_, buf, bytes, false, timeout, poller_),
                [&](gloo::transport::UnboundBuffer& b) { b.recv(sources, p2pSlot(tag)); });
  }

  std::unique_ptr<Backend> makeGroup(std::shared_ptr<rdzv::Store> store, int rank, int size,
                                     milliseconds timeout) override {
    return std::make_unique<GlooBackend>(device_, std::move(store), rank, size, timeout);
  }

  ~GlooBackend() override { poller_->stop(); }  // before the context its requests use
  // A failed communicator's receives may have been dropped unfinished (an exchange posts them
  // first, then another step fails): a message for one stays unread on its level-triggered
  // socket, and Gloo's device thread, which finds no buffer for it, spins on it. Ending the
  // connections stops that, and the peers' operations fail at once instead of at their
  // deadlines. This rank's own requests fail at once too (GlooPoller::abort), and so does its
  // own pending collective, also one whose transfer is under way (AbortableGlooContext).
  void abort() override {
    poller_->abort();
    context_->abortWaits();
    context_->closeConnections();
  }
  const char* transport() const override { return "tcp"; }

 private:
  // Posts a point-to-point request. After abort() the pairs are closed and Gloo refuses a post in
  // its own words (an epoll_ctl failure): the request's error says what happened instead.
  template <class Post>
  std::shared_ptr<Request::State> post(std::shared_ptr<GlooP2P> request, Post&& postOn) {
    if (poller_->aborted()) std::rethrow_exception(request->abortedError());
    try {
      postOn(request->buffer());
      return request;
    } catch (...) {
      if (poller_->aborted()) std::rethrow_exception(request->abortedError());
      rethrowGlooAsDrun();
    }
  }

  // Every functional op: its tag (distinct per call) and its deadline.
  template <class Options>
  static void limit(Options& opts, uint32_t tag, milliseconds timeout) {
    opts.setTag(tag);
    opts.setTimeout(timeout);
  }

  template <class T>
  void broadcast(const Collective& c, uint32_t tag) {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput<T>(static_cast<T*>(c.recv), c.count);
    opts.setRoot(c.root);
    limit(opts, tag, c.timeout);
    gloo::broadcast(opts);
  }

  template <class T>
  void reduce(const Collective& c, uint32_t tag) {
    gloo::ReduceOptions opts(context_);
    opts.setOutput<T>(static_cast<T*>(c.recv), c.count);
    opts.setRoot(c.root);
    opts.setReduceFunction(reduceFunction(c.dtype, c.op));
    limit(opts, tag, c.timeout);
    gloo::reduce(opts);
    if (c.op == ReduceOp::Avg && context_->rank == c.root)
      divideInPlace(c.recv, c.count, c.dtype, context_->size);
  }

  template <class T>
  void allReduce(const Collective& c, uint32_t tag) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput<T>(static_cast<T*>(c.recv), c.count);
    opts.setReduceFunction(reduceFunction(c.dtype, c.op));
    limit(opts, tag, c.timeout);
    gloo::allreduce(opts);
    if (c.op == ReduceOp::Avg) divideInPlace(c.recv, c.count, c.dtype, context_->size);
  }

  template <class T>
  void scatter(const Collective& c, uint32_t tag) {
    gloo::ScatterOptions opts(context_);
    std::vector<T*> blocks;
    if (context_->rank == c.root) {
      for (int r = 0; r < context_->size; ++r)
        blocks.push_back(const_cast<T*>(static_cast<const T*>(c.send)) + r * c.count);
      opts.setInputs<T>(blocks, c.count);
    }
    opts.setOutput<T>(static_cast<T*>(c.recv), c.count);
    opts.setRoot(c.root);
    limit(opts, tag, c.timeout);
    gloo::scatter(opts);
  }

  template <class T>
  void gather(const Collective& c, uint32_t tag) {
    gloo::GatherOptions opts(context_);
    opts.setInput<T>(const_cast<T*>(static_cast<const T*>(c.send)), c.count);
    if (context_->rank == c.root) opts.setOutput<T>(static_cast<T*>(c.recv), c.count * context_->size);
    opts.setRoot(c.root);
    limit(opts, tag, c.timeout);
    gloo::gather(opts);
  }

  template <class T>
  void allGather(const Collective& c, uint32_t tag) {
    gloo::AllgatherOptions opts(context_);
    opts.setInput<T>(const_cast<T*>(static_cast<const T*>(c.send)), c.count);
    opts.setOutput<T>(static_cast<T*>(c.recv), c.count * context_->size);
    limit(opts, tag, c.timeout);
    gloo::allgather(opts);
  }

  template <class T>
  void allToAll(const Collective& c, const T* send, T* recv, milliseconds timeout, uint32_t tag) {
    gloo::AlltoallOptions opts(context_);
    opts.setInput<T>(const_cast<T*>(send), c.count * context_->size);
    opts.setOutput<T>(recv, c.count * context_->size);
    limit(opts, tag, timeout);
    gloo::alltoall(opts);
  }

  // Every rank sends block i to rank i (all_to_all), then reduces the blocks it received: the
  // same (n-1)/n of the data on the wire as a ring reduce-scatter, with one API family. The blocks
  // land in a buffer kept between operations: a fresh zero-filled one per call would page-fault
  // it whole every time (raw Gloo reuses its output; figures: docs/benchmarks/comm.md).
  template <class T>
  void reduceScatter(const Collective& c, uint32_t tag) {
    const size_t n = static_cast<size_t>(context_->size);
    if (blocks_.size() < c.count * n * sizeof(T)) blocks_ = std::vector<char>(c.count * n * sizeof(T));
    T* blocks = reinterpret_cast<T*>(blocks_.data());
    allToAll<T>(c, static_cast<const T*>(c.send), blocks, c.timeout, tag);
    ReduceFn fn = reduceFunction(c.dtype, c.op);
    std::memcpy(c.recv, blocks, c.count * sizeof(T));
    for (size_t r = 1; r < n; ++r) fn(c.recv, c.recv, blocks + r * c.count, c.count);
    if (c.op == ReduceOp::Avg) divideInPlace(c.recv, c.count, c.dtype, context_->size);
  }

  void barrier(const Collective& c, uint32_t tag) {
    gloo::BarrierOptions opts(context_);
    limit(opts, tag, c.timeout);
    gloo::barrier(opts);
  }

  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<GlooPoller> poller_;
  std::shared_ptr<AbortableGlooContext> context_;
  uint32_t nextTag_ = 0;
  std::vector<char> blocks_;  // reduce_scatter's received blocks (collectives run one at a time)
};

}  // namespace

std::unique_ptr<Backend> makeGlooBackend(std::shared_ptr<GlooDevice> device, std::shared_ptr<rdzv::Store> store,
                                         int rank, int size, milliseconds timeout) {
  return std::make_unique<GlooBackend>(std::move(device), std::move(store), rank, size, timeout);
}

}  // namespace drun::comm::detail

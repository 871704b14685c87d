// EtcdConnection: one HTTP/1.1 connection (plain or TLS) to one etcd member's gRPC-JSON
// gateway, with Boost.Beast. Used by EtcdClient (etcd_client.hpp), which picks the member, fails
// over and reads the JSON.
//
// Every call runs on the caller's thread over a private io_context, bounded by a Deadline: the
// socket is closed when it passes (TimeoutError). No event loop of anyone else is involved.
// Unary calls reuse the connection (keep-alive); a stream (watch) takes the connection for its
// whole life and closes it afterwards.
//
// Threading: one call at a time (the owner serialises); interrupt() may be called from any
// thread and ends the call in progress (and every later one) with NetworkError.
// Ownership: owns its socket and io_context.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "drun/common/deadline.hpp"
#include "drun/common/host_port.hpp"

namespace drun::rdzv::etcd {

using Endpoint = HostPort;  // one member; IPv6 printed in brackets

struct HttpReply {
  unsigned status = 0;
  std::string body;
};

// A reply body (or a stream's buffered, unfinished line) larger than this is a protocol error.
inline constexpr size_t kMaxReplyBytes = 64u << 20;

// TCP keep-alive of a connection, so that a member whose host was cut off (it never closes the
// connection where we can see) is noticed while the connection is silent: a watch is a reply
// that may stay silent for long. For a silence bound S (the lease TTL): probes after S/3 idle,
// S/3 apart (the kernel counts whole seconds: at least 1), and TCP_USER_TIMEOUT = S, which ends
// the connection once S passed without an answer even where the rounding would probe longer.
struct KeepAliveProbes {
  int idleSeconds = 1;      // TCP_KEEPIDLE
  int intervalSeconds = 1;  // TCP_KEEPINTVL
  int count = 2;            // TCP_KEEPCNT
  unsigned userTimeoutMs = 3000;  // TCP_USER_TIMEOUT
};
KeepAliveProbes keepAliveProbesFor(std::chrono::milliseconds silence);
// Sets them (and SO_KEEPALIVE) on a connected socket. Returns false when the kernel refused one.
bool applyKeepAliveProbes(int fd, const KeepAliveProbes& probes);

class EtcdConnection {
 public:
  // caFile: "" = plain HTTP; else HTTPS, the member's certificate verified against this CA.
  // requireLeader: every request asks for a leader (makeRequest says why); false for reads
  // that a member without one may serve.
  EtcdConnection(Endpoint endpoint, std::string caFile, KeepAliveProbes probes = {}, bool requireLeader = true);
  ~EtcdConnection();
  EtcdConnection(const EtcdConnection&) = delete;
  EtcdConnection& operator=(const EtcdConnection&) = delete;

  // POST `target` with a JSON body; `token` goes in the Authorization header when not empty.
  // Throws TimeoutError (the deadline passed), NetworkError (refused, reset, closed),
  // ProtocolError (not HTTP, a body over kMaxReplyBytes). `sent` (when given) tells whether the
  // request may have reached the member (false: it surely did not).
  HttpReply post(const std::string& target, const std::string& body, const std::string& token,
                 const Deadline& deadline, bool* sent = nullptr);

  // POST, then hands each line of the (chunked) reply body to onLine until it returns false
  // (returns normally), the body ends (NetworkError) or the deadline passes (TimeoutError).
  // A reply that is not 200 is given whole to onLine once, and the stream ends.
  void stream(const std::string& target, const std::string& body, const std::string& token,
              const Deadline& deadline, const std::function<bool(unsigned status, std::string_view)>& onLine);

  // Between calls: a kept-alive connection whose member closed it (the member killed or
  // restarted; the kernel holds such a socket in CLOSE-WAIT until it is closed here) is closed
  // now, without blocking. Returns true when it was.
  bool closeIfPeerClosed();

  void interrupt();
  const Endpoint& endpoint() const { return endpoint_; }

 private:
  struct Impl;
  Endpoint endpoint_;
  bool requireLeader_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace drun::rdzv::etcd
